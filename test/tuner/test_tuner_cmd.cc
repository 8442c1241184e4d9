// SPDX-License-Identifier: Apache-2.0
// `vigil tuner explain|fit` on files, and the tuner's rows of `vigil top` / `vigil export`
// while a tuner context is live.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

#include "agree_lib.h"
#include "rules.h"
#include "tuner_cmd.h"

using namespace vigil::tuner;

namespace {

struct Run {
    int rc;
    std::string out, err;
};

std::string slurp(FILE *f)
{
    std::string s;
    std::rewind(f);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) s.append(buf, n);
    std::fclose(f);
    return s;
}

Run run(std::vector<std::string> args)
{
    std::vector<char *> argv;
    for (std::string &a : args) argv.push_back(a.data());
    FILE *out = std::tmpfile(), *err = std::tmpfile();
    const int rc = vigil::tool::tuner_command_to(static_cast<int>(argv.size()), argv.data(), out, err);
    return {rc, slurp(out), slurp(err)};
}

std::string data(const char *name) { return std::string(VIGIL_TUNER_TEST_DATA) + "/" + name; }

std::string write_tmp(const std::string &text)
{
    char path[] = "/tmp/vigil-cmd-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    close(fd);
    return path;
}

} // namespace

TEST_CASE("vigil tuner explain names the decision and the rule, per view", "[tool]")
{
    const std::string rules = write_tmp("# example\n"
                                        "allreduce,0,65536,tree,simple,2,1,-1,-1,1\n"
                                        "allreduce,65537,1048576,ring,simple,4,4,32,1,0\n"
                                        "allreduce,65537,1048576,ring,ll,-1,4,32,-1,-1,degraded,8192\n"
                                        "allreduce,1048577,-1,ring,ll128,-1,-1,-1\n");
    Run r = run({"tuner", "explain", "--rules", rules, "--coll", "allreduce", "--bytes", "1M", "--nodes", "4",
                 "--ranks", "32"});
    INFO(r.out << r.err);
    CHECK(r.rc == 0);
    CHECK(r.out.find("decision: ring/simple, channels 4") != std::string::npos);
    CHECK(r.out.find(rules + ":3: allreduce,65537,1048576,ring,simple,4,4,32,1,0") != std::string::npos);
    CHECK(r.out.find("regBuff") != std::string::npos); // the rule matches on regBuff: warned
    r = run({"tuner", "explain", "--rules", rules, "--coll", "allreduce", "--bytes", "1M", "--nodes", "4", "--ranks",
             "32", "--pipe-ops", "2", "--health", "degraded"});
    CHECK(r.out.find("decision: ring/ll, channels NCCL's") != std::string::npos);
    CHECK(r.out.find("chunk 8192 B") != std::string::npos);
    r = run({"tuner", "explain", "--rules", rules, "--coll", "allreduce", "--bytes", "4M", "--nodes", "4", "--ranks",
             "32", "--unusable", "ring/ll128"});
    CHECK(r.out.find("skipped " + rules + ":5") != std::string::npos);
    CHECK(r.out.find("decision: NCCL's own choice") != std::string::npos);
    r = run({"tuner", "explain", "--rules", rules, "--coll", "allgather", "--bytes", "1K", "--nodes", "4", "--ranks",
             "32", "--health", "failover"});
    CHECK(r.out.find("re-estimates") != std::string::npos);
    unlink(rules.c_str());

    const std::string bad = write_tmp("allreduce,0,1,ring,simple,1,-1,-1\nallreduce,0,1,warp,simple,1,-1,-1\n");
    r = run({"tuner", "explain", "--rules", bad, "--coll", "allreduce", "--bytes", "1", "--nodes", "1", "--ranks", "8"});
    CHECK(r.rc == 1);
    CHECK(r.err.find(bad + ":2: unknown algorithm 'warp'") != std::string::npos);
    unlink(bad.c_str());
    CHECK(run({"tuner", "explain", "--coll", "allreduce"}).rc == 2);
    CHECK(run({"tuner", "nonsense"}).rc == 2);
}

TEST_CASE("vigil tuner fit: fastest per size from nccl-tests tables, loadable by the tuner", "[tool]")
{
    Run r = run({"tuner", "fit", "--nodes", "4", "--ranks", "32", data("ar_ring_ll.txt"), data("ar_ring_ll128.txt"),
                 data("ar_ring_simple.txt")});
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("allreduce,0,65535,ring,ll,-1,4,32\n") != std::string::npos);
    CHECK(r.out.find("allreduce,65536,1048575,ring,ll128,-1,4,32\n") != std::string::npos);
    CHECK(r.out.find("allreduce,1048576,-1,ring,simple,-1,4,32\n") != std::string::npos);
    Rules rules;
    std::string why;
    REQUIRE(parse_rules(r.out, &rules, &why));
    CHECK(rules.rules.size() == 3);
    // Named explicitly, the file name does not matter; a 100% margin keeps the first winner.
    r = run({"tuner", "fit", "--margin", "99", "tree/ll=" + data("ar_ring_ll.txt"), data("ar_ring_ll128.txt")});
    CHECK(r.rc == 0);
    CHECK(r.out.find("allreduce,0,1048575,tree,ll,-1,-1,-1\n") != std::string::npos); // kept up to 64K
    CHECK(r.out.find("allreduce,1048576,-1,ring,ll128,-1,-1,-1\n") != std::string::npos);
    // A table with wrong values, and a file whose algorithm cannot be told, are refused.
    const std::string wrong = write_tmp("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
                                        "   1024   256 float sum -1 10.0 0.1 0.1 3 10.0 0.1 0.1 0\n");
    r = run({"tuner", "fit", "ring/ll=" + wrong});
    CHECK(r.rc == 1);
    CHECK(r.err.find("wrong values") != std::string::npos);
    r = run({"tuner", "fit", wrong});
    CHECK(r.rc == 1);
    unlink(wrong.c_str());
}

TEST_CASE("vigil top and vigil export show a live context's agreed view", "[tool]")
{
    using namespace vigil::tuner::test;
    setenv("NCCL_TUNER_CONFIG_FILE", "/nonexistent/rules", 1);
    Config cfg;
    cfg.store = "shm";
    cfg.block = 4;
    cfg.publish_ms = 10;
    Tuner t(cfg);
    CommInfo info;
    uint64_t comm = 0;
    REQUIRE(getentropy(&comm, sizeof(comm)) == 0);
    info.comm = comm | 1;
    info.has_comm = true;
    info.nranks = 1;
    info.nnodes = 2;
    info.abi = 7;
    info.model = default_model();
    Context *c = nullptr;
    std::string why;
    const uint64_t t0 = now_ns();
    REQUIRE(t.open(info, std::make_unique<ScriptedHealth>(t0, std::vector<ScriptedHealth::Step>{
                                                                 {0, {nic("eth0", 1, 400), nic("eth1", 0, 1000)}}}),
                   &c, &why) == 0);
    for (int i = 0; i < 40; ++i) {
        float table[21];
        fill_table(4, 1 << 20, table);
        int ch = 0;
        c->get_coll_info(4, 1 << 20, 1, table, 7, 3, 0, &ch);
    }
    usleep(150000); // the status is written every 50 ms
    char hex[24];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(info.comm));
    const std::string top = vigil::tool::tuner_top_text();
    INFO(top);
    CHECK(top.find(hex) != std::string::npos);
    CHECK(top.find("degraded  0.40") != std::string::npos);
    const std::string m = vigil::tool::tuner_metrics_text();
    INFO(m);
    CHECK(m.find(std::string("vigil_tuner_view_state{pid=")) != std::string::npos);
    CHECK(m.find(std::string("comm=\"") + hex + "\",source=") != std::string::npos);
    CHECK(m.find(std::string("vigil_tuner_calls_total{")) != std::string::npos);
    CHECK(m.find("# TYPE vigil_tuner_view_fraction gauge") != std::string::npos);
    t.close(c);
    char shm[96];
    std::snprintf(shm, sizeof(shm), "/dev/shm/vigil-tstore-%u-%s", static_cast<unsigned>(getuid()), hex);
    unlink(shm);
}
