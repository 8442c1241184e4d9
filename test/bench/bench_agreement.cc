// SPDX-License-Identifier: Apache-2.0
// vigil-agreebench: N ranks of one communicator agreeing on the health view through a real
// Redis, for scripts/bench_agreement.sh. Each rank is a tuner (its own Tuner: background
// thread and store connection, as a rank process has) driven through the tuner core that
// the ncclTunerPlugin_v5..v7 shims call, asking getCollInfo at a steady rate as NCCL's
// enqueue does per collective. Ranks run as `--procs` processes of N/procs ranks each, on
// `--hosts` simulated hosts: as root each host gets its own UTS and mount namespace, so its
// hostname and /dev/shm are its own, as on a real host.
//
// It starts its own redis-server (a real one, ended by PID). Phases: join (until every
// rank has resolved its first view), steady (no health change), change (rank 0's NIC eth0
// turns degraded at the phase's start, as its registry would show it), optionally a fault
// (the store restarted empty, the last rank stalled for half the phase, or the process of
// the last rank killed), stop. Prints one JSON line: the store's commands and CPU per phase
// (Redis INFO), the ranks' CPU, getCollInfo latency per rank, the agreement latency (from
// the change to the first block whose register carries it, in blocks and ms, per rank),
// whether every rank used the same view for every block, and, with a fault, the longest
// call and the blocks the ranks went on through after it.
// Not a test: a benchmark (the script prints the table).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <sched.h>
#include <string>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "agree_lib.h"
#include "redis_lib.h"
#include "tuner.h"

using namespace vigil::tuner;
using namespace vigil::tuner::test;

namespace {

enum Phase : uint32_t { kJoin = 0, kSteady = 1, kChange = 2, kFault = 3, kStop = 4 };
enum class Fault { kNone, kRestart, kStall, kDie };
constexpr uint32_t kViewLog = 1024; // blocks whose view each rank records

/// What one rank reports (in the shared control block).
struct RankOut {
    uint64_t calls = 0;
    uint64_t p50_ns = 0, p99_ns = 0, max_ns = 0;
    uint64_t waits = 0, wait_ns = 0;
    uint64_t block_at_change = UINT64_MAX;   ///< the block its calls were in at the change
    uint64_t changed_block = UINT64_MAX;     ///< first block whose view carried the change
    uint64_t changed_ns = 0;                 ///< when its calls entered that block
    uint64_t blocks = 0;                     ///< blocks entered
    uint64_t fault_max_ns = 0;               ///< its longest call in the fault phase
    uint64_t block_at_fault = UINT64_MAX;    ///< the block its calls were in at the fault
    uint64_t last_block = 0;                 ///< the block its calls were in at the end
    uint32_t ready = 0;                      ///< its first view is resolved
    uint32_t done = 0;
    uint64_t views[kViewLog];                ///< view of each block (0: not reached)
};

struct Control {
    std::atomic<uint32_t> phase;
    std::atomic<uint32_t> ready;
    std::atomic<uint32_t> failed;
    uint32_t pad;
    std::atomic<uint64_t> change_ns; ///< 0 until the change phase
    std::atomic<uint64_t> stall_until_ns; ///< the stalled rank makes no call before this
    uint32_t stall_rank;
    uint64_t t0_ns;
    RankOut ranks[1]; ///< [nranks]
};

struct Options {
    std::string host = "127.0.0.1";
    int port = 0;
    Fault fault = Fault::kNone;
    double fault_s = 20;
    uint32_t ranks = 16, procs = 0, hosts = 0;
    double rate = 200;      // getCollInfo calls per second per rank
    int tick_ms = 5;        // the driver wakes this often and makes rate*tick calls per rank
    uint64_t block = 128;
    double join_s = 120, steady_s = 20, change_s = 10;
    bool isolate = true;    // namespaces per simulated host (root only)
};

/// Health of one rank: all NICs ok; rank 0's eth0 degraded (250 permille) once the change
/// phase has begun.
class PhaseHealth final : public HealthSource
{
public:
    PhaseHealth(const Control *ctl, bool victim) : ctl_(ctl), victim_(victim) {}
    void read(MemberRecord *rec) override
    {
        const uint64_t at = ctl_->change_ns.load(std::memory_order_acquire);
        const bool bad = victim_ && at != 0 && now_ns() >= at;
        rec->n_nics = 2;
        rec->nics[0] = nic("eth0", bad ? 1 : 0, bad ? 250 : 1000);
        rec->nics[1] = nic("eth1", 0, 1000);
    }

private:
    const Control *ctl_;
    bool victim_;
};

/// Log-linear histogram of nanoseconds (8 steps per power of two).
struct Hist {
    std::vector<uint32_t> b = std::vector<uint32_t>(600, 0);
    uint64_t n = 0, max = 0;
    static size_t index(uint64_t v)
    {
        if (v < 64) return static_cast<size_t>(v);
        const int e = 63 - __builtin_clzll(v);
        return std::min<size_t>(599, 64 + static_cast<size_t>(e - 6) * 8 + ((v >> (e - 3)) & 7));
    }
    static uint64_t value(size_t i)
    {
        if (i < 64) return i;
        const size_t e = (i - 64) / 8 + 6, s = (i - 64) % 8;
        return (uint64_t{8} | s) << (e - 3);
    }
    void add(uint64_t v)
    {
        ++b[index(v)];
        ++n;
        max = std::max(max, v);
    }
    uint64_t quantile(double q) const
    {
        const uint64_t want = static_cast<uint64_t>(q * static_cast<double>(n));
        uint64_t seen = 0;
        for (size_t i = 0; i < b.size(); ++i)
            if ((seen += b[i]) > want) return value(i);
        return max;
    }
    void clear() { std::fill(b.begin(), b.end(), 0), n = 0, max = 0; }
};

uint64_t view_key(const View &v)
{
    return (uint64_t{v.state} + 1) | uint64_t{v.permille} << 8 | uint64_t{v.degraded_nics} << 24 |
           uint64_t{v.failed_nics} << 40 | (v.digest << 56);
}

struct Member {
    std::unique_ptr<Tuner> tuner;
    Context *ctx = nullptr;
    uint32_t rank = 0;
    Hist hist;
    uint64_t last_block = UINT64_MAX;
};

void isolate_host(uint32_t index)
{
    // A host of its own: hostname and /dev/shm (the host's registry and tuner segments).
    if (unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0) return;
    const std::string name = "simhost-" + std::to_string(index);
    (void)sethostname(name.c_str(), name.size());
    (void)mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    (void)mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777");
}

int run_proc(const Options &o, Control *ctl, uint32_t first, uint32_t count, uint64_t comm)
{
    Config cfg;
    cfg.block = o.block;
    cfg.store = "redis://" + o.host + ":" + std::to_string(o.port);
    std::vector<Member> m(count);
    for (uint32_t i = 0; i < count; ++i) {
        m[i].rank = first + i;
        m[i].tuner = std::make_unique<Tuner>(cfg);
        std::string why;
        if (m[i].tuner->open(comm_info(comm, o.ranks, o.hosts, 5), std::make_unique<PhaseHealth>(ctl, m[i].rank == 0), &m[i].ctx, &why) != 0 ||
            !m[i].ctx->agreeing()) {
            std::fprintf(stderr, "rank %u: open: %s\n", m[i].rank, why.c_str());
            ctl->failed.fetch_add(1);
            return 1;
        }
    }
    const uint64_t tick = static_cast<uint64_t>(o.tick_ms) * 1000000ull;
    const double per_tick = o.rate * o.tick_ms / 1000.0;
    double owed = 0;
    uint64_t next = now_ns();
    uint32_t last_phase = kJoin;
    float table[21];
    while (true) {
        const uint32_t phase = ctl->phase.load(std::memory_order_acquire);
        if (phase == kStop) break;
        if (phase != last_phase && phase == kSteady)
            for (Member &x : m) x.hist.clear(); // the join phase's waits are not the steady cost
        last_phase = phase;
        const uint64_t stall_until = ctl->stall_until_ns.load(std::memory_order_acquire);
        owed += per_tick;
        const int calls = static_cast<int>(owed);
        owed -= calls;
        const uint64_t change = ctl->change_ns.load(std::memory_order_acquire);
        for (Member &x : m) {
            RankOut &out = ctl->ranks[x.rank];
            if (x.rank == ctl->stall_rank && stall_until != 0 && now_ns() < stall_until) continue;
            for (int k = 0; k < calls; ++k) {
                const uint64_t idx = x.ctx->calls();
                const uint64_t bytes = (uint64_t{1} << (idx % 24)) + idx % 1000;
                const int coll = (idx % 3 == 0) ? 2 : 4;
                fill_table(coll, bytes, table);
                int channels = 0;
                const uint64_t a = now_ns();
                x.ctx->get_coll_info(coll, bytes, 1, table, 7, 3, 0, &channels);
                const uint64_t b = now_ns();
                if (phase == kFault) out.fault_max_ns = std::max(out.fault_max_ns, b - a);
                else x.hist.add(b - a);
                const uint64_t blk = idx / o.block;
                if (blk != x.last_block) {
                    x.last_block = blk;
                    out.last_block = blk;
                    ++out.blocks;
                    const View &v = x.ctx->current_view();
                    if (blk < kViewLog && v.state != 3) out.views[blk] = view_key(v);
                    if (phase == kFault && out.block_at_fault == UINT64_MAX) out.block_at_fault = blk;
                    if (!out.ready && v.state != 3) {
                        out.ready = 1;
                        ctl->ready.fetch_add(1);
                    }
                    if (change != 0 && out.block_at_change == UINT64_MAX) out.block_at_change = blk;
                    if (change != 0 && out.changed_block == UINT64_MAX && v.state == 1) {
                        out.changed_block = blk;
                        out.changed_ns = b;
                    }
                }
            }
        }
        next += tick;
        const uint64_t now = now_ns();
        if (next + tick < now) next = now; // far behind: skip, do not burst
        if (next > now) std::this_thread::sleep_for(std::chrono::nanoseconds(next - now));
    }
    for (Member &x : m) {
        RankOut &out = ctl->ranks[x.rank];
        out.calls = x.ctx->calls();
        out.waits = x.ctx->waits();
        out.wait_ns = x.ctx->wait_ns();
        out.p50_ns = x.hist.quantile(0.50);
        out.p99_ns = x.hist.quantile(0.99);
        out.max_ns = x.hist.max;
        x.tuner->close(x.ctx);
        x.tuner.reset();
        out.done = 1;
    }
    return 0;
}

struct StoreStats {
    double commands = 0, cpu_s = 0, evals = 0, gets = 0, calls_other = 0, clients = 0;
};

double field(const std::string &text, const std::string &key)
{
    const size_t p = text.find("\n" + key + ":");
    if (p == std::string::npos) return 0;
    return std::strtod(text.c_str() + p + key.size() + 2, nullptr);
}

double cmdstat_calls(const std::string &text, const std::string &cmd)
{
    const size_t p = text.find("cmdstat_" + cmd + ":calls=");
    if (p == std::string::npos) return 0;
    return std::strtod(text.c_str() + p + cmd.size() + 15, nullptr);
}

bool store_stats(const Options &o, StoreStats *out)
{
    RedisConnection c;
    RedisReply r;
    std::string why;
    if (c.connect(o.host, o.port, 2000, &why) != 0 || c.command({"INFO", "everything"}, &r, &why) != 0 ||
        r.type != RedisReply::kString) {
        std::fprintf(stderr, "INFO: %s\n", why.c_str());
        return false;
    }
    const std::string t = "\n" + r.str;
    out->commands = field(t, "total_commands_processed");
    out->cpu_s = field(t, "used_cpu_sys") + field(t, "used_cpu_user");
    out->evals = cmdstat_calls(t, "eval") + cmdstat_calls(t, "evalsha");
    out->gets = cmdstat_calls(t, "get") + cmdstat_calls(t, "mget");
    out->clients = field(t, "connected_clients");
    return true;
}

// CPU seconds (user + system) of one process and all its threads.
double proc_cpu_s(pid_t pid)
{
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = std::fopen(path, "r");
    if (f == nullptr) return 0;
    char buf[1024];
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    const char *p = std::strrchr(buf, ')');
    if (p == nullptr) return 0;
    unsigned long ut = 0, st = 0;
    // Fields after ")": state(3) ... utime(14) stime(15).
    if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return 0;
    return static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double median(std::vector<double> v)
{
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void usage()
{
    std::fprintf(stderr,
                 "usage: vigil-agreebench [--ranks N] [--procs P] [--hosts H] [--rate CALLS_PER_S] [--tick-ms MS] [--block B] "
                 "[--join-s S] [--steady-s S] [--change-s S] [--fault none|restart|stall|die] [--fault-s S] "
                 "[--no-isolate]\n");
}

} // namespace

int main(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) {
                usage();
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--ranks") o.ranks = static_cast<uint32_t>(std::atoi(next()));
        else if (a == "--procs") o.procs = static_cast<uint32_t>(std::atoi(next()));
        else if (a == "--hosts") o.hosts = static_cast<uint32_t>(std::atoi(next()));
        else if (a == "--rate") o.rate = std::atof(next());
        else if (a == "--tick-ms") o.tick_ms = std::atoi(next());
        else if (a == "--block") o.block = static_cast<uint64_t>(std::atoll(next()));
        else if (a == "--join-s") o.join_s = std::atof(next());
        else if (a == "--steady-s") o.steady_s = std::atof(next());
        else if (a == "--change-s") o.change_s = std::atof(next());
        else if (a == "--no-isolate") o.isolate = false;
        else if (a == "--fault-s") o.fault_s = std::atof(next());
        else if (a == "--fault") {
            const std::string f = next();
            if (f == "none") o.fault = Fault::kNone;
            else if (f == "restart") o.fault = Fault::kRestart;
            else if (f == "stall") o.fault = Fault::kStall;
            else if (f == "die") o.fault = Fault::kDie;
            else return usage(), 2;
        }
        else return usage(), 2;
    }
    if (o.procs == 0) o.procs = o.ranks;
    if (o.hosts == 0) o.hosts = o.procs;
    if (o.ranks == 0 || o.procs > o.ranks || o.hosts > o.procs || o.tick_ms <= 0 || o.block == 0) return usage(), 2;
    if (getuid() != 0) o.isolate = false;
    RedisServer redis;
    std::string why;
    if (!redis.start(&why, {"--maxclients", "20000", "--maxmemory-policy", "noeviction"})) {
        std::fprintf(stderr, "redis-server: %s\n", why.c_str());
        return 1;
    }
    o.port = redis.port();
    const size_t bytes = sizeof(Control) + sizeof(RankOut) * o.ranks;
    void *mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return std::perror("mmap"), 1;
    auto *ctl = new (mem) Control{};
    for (uint32_t r = 0; r < o.ranks; ++r) new (&ctl->ranks[r]) RankOut{};
    ctl->t0_ns = now_ns();
    ctl->stall_rank = UINT32_MAX;
    uint64_t comm = 0;
    if (getrandom(&comm, sizeof(comm), 0) != sizeof(comm)) return 1;
    comm |= 1;

    // The rank processes' pids, for their CPU and for the fault that kills one.
    auto *proc_pids = static_cast<pid_t *>(
        mmap(nullptr, sizeof(pid_t) * o.procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (proc_pids == MAP_FAILED) return std::perror("mmap"), 1;
    std::vector<pid_t> pids; // the hosts
    for (uint32_t h = 0; h < o.hosts; ++h) {
        const pid_t pid = fork();
        if (pid < 0) return std::perror("fork"), 1;
        if (pid != 0) {
            pids.push_back(pid);
            continue;
        }
        // A host: ends with the driver, whatever ends it, and its ranks with it.
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
        if (o.isolate) isolate_host(h);
        std::vector<pid_t> mine;
        for (uint32_t p = o.procs * h / o.hosts; p < o.procs * (h + 1) / o.hosts; ++p) {
            const uint32_t first = static_cast<uint32_t>(uint64_t{o.ranks} * p / o.procs);
            const uint32_t last = static_cast<uint32_t>(uint64_t{o.ranks} * (p + 1) / o.procs);
            const pid_t r = fork();
            if (r == 0) {
                (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
                proc_pids[p] = getpid();
                _exit(run_proc(o, ctl, first, last - first, comm));
            }
            if (r > 0) mine.push_back(r);
        }
        int failed = 0;
        for (pid_t r : mine) {
            int st = 0;
            if (waitpid(r, &st, 0) != r || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
        }
        _exit(std::min(failed, 255));
    }
    auto cpu_all = [&] {
        double s = 0;
        for (uint32_t p = 0; p < o.procs; ++p)
            if (proc_pids[p] > 0) s += proc_cpu_s(proc_pids[p]);
        return s;
    };
    auto sleep_s = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
    const uint64_t join_start = now_ns();
    bool joined = false;
    while (now_ns() - join_start < static_cast<uint64_t>(o.join_s * 1e9) && ctl->failed.load() == 0) {
        if (ctl->ready.load() >= o.ranks) {
            joined = true;
            break;
        }
        sleep_s(0.05);
    }
    const double join_s = static_cast<double>(now_ns() - join_start) / 1e9;
    StoreStats s0, s1, s2;
    bool stats_ok = store_stats(o, &s0);
    const double c0 = cpu_all();
    const uint64_t t_steady = now_ns();
    ctl->phase.store(kSteady);
    sleep_s(joined ? o.steady_s : 0);
    stats_ok = store_stats(o, &s1) && stats_ok;
    const double c1 = cpu_all();
    const uint64_t t_change = now_ns();
    ctl->change_ns.store(t_change);
    ctl->phase.store(kChange);
    sleep_s(joined ? o.change_s : 0);
    stats_ok = store_stats(o, &s2) && stats_ok;
    const double c2 = cpu_all();
    const uint64_t t_end = now_ns();
    // The fault, on ranks that went through join, steady and change.
    const uint32_t victim_rank = o.ranks - 1;
    pid_t killed = -1;
    StoreStats f0, f1;
    bool fault_stats = false;
    if (o.fault != Fault::kNone && joined) {
        ctl->phase.store(kFault);
        if (o.fault == Fault::kRestart) {
            redis.stop(); // SIGKILL: the store loses everything
            sleep_s(0.3);
            if (!redis.restart(&why)) std::fprintf(stderr, "redis-server restart: %s\n", why.c_str());
        } else if (o.fault == Fault::kStall) {
            ctl->stall_rank = victim_rank;
            ctl->stall_until_ns.store(now_ns() + static_cast<uint64_t>(o.fault_s / 2 * 1e9));
        } else {
            killed = proc_pids[o.procs - 1]; // the process of the last rank
            if (killed > 0) kill(killed, SIGKILL);
        }
        fault_stats = store_stats(o, &f0);
        sleep_s(o.fault_s);
        fault_stats = store_stats(o, &f1) && fault_stats;
    }
    ctl->phase.store(kStop);
    const uint64_t t_stop = now_ns();
    {
        // What the store served over the whole run, command by command (the driver's log).
        RedisConnection c;
        RedisReply r;
        if (c.connect(o.host, o.port, 2000, &why) == 0 && c.command({"INFO", "commandstats"}, &r, &why) == 0)
            std::fprintf(stderr, "store commands over the run:\n%s\n", r.str.c_str());
    }
    // A rank still waiting for a register 30 s after the end is not waited for.
    int failed_procs = killed > 0 ? -1 : 0; // the killed one fails by design
    std::vector<pid_t> left = pids;
    for (int i = 0; i < 3000 && !left.empty(); ++i) {
        for (size_t k = 0; k < left.size();) {
            int st = 0;
            if (waitpid(left[k], &st, WNOHANG) != left[k]) {
                ++k;
                continue;
            }
            failed_procs += WIFEXITED(st) ? WEXITSTATUS(st) : 1;
            left.erase(left.begin() + static_cast<long>(k));
        }
        if (!left.empty()) sleep_s(0.01);
    }
    for (pid_t p : left) {
        kill(p, SIGKILL); // its ranks go with it (their death signal)
        int st = 0;
        (void)waitpid(p, &st, 0);
        ++failed_procs;
    }
    redis.stop();

    const double steady = static_cast<double>(t_change - t_steady) / 1e9;
    const double change = static_cast<double>(t_end - t_change) / 1e9;
    const double n = o.ranks;
    std::vector<double> p50, p99, lat_blocks, lat_ms;
    double worst_p99 = 0, calls = 0, waits = 0;
    uint64_t agreed_block = UINT64_MAX;
    bool agree = true;
    uint32_t saw_change = 0;
    for (uint32_t r = 0; r < o.ranks; ++r) {
        const RankOut &x = ctl->ranks[r];
        p50.push_back(static_cast<double>(x.p50_ns));
        p99.push_back(static_cast<double>(x.p99_ns));
        worst_p99 = std::max(worst_p99, static_cast<double>(x.p99_ns));
        calls += static_cast<double>(x.calls);
        waits += static_cast<double>(x.waits);
        if (x.changed_block == UINT64_MAX) continue;
        ++saw_change;
        if (agreed_block == UINT64_MAX) agreed_block = x.changed_block;
        agree &= x.changed_block == agreed_block;
        lat_blocks.push_back(static_cast<double>(x.changed_block - x.block_at_change));
        lat_ms.push_back(static_cast<double>(x.changed_ns - t_change) / 1e6);
    }
    // Every rank that reached a block used the same view there.
    uint64_t compared = 0, disagreeing_blocks = 0;
    for (uint32_t b = 0; b < kViewLog; ++b) {
        uint64_t first = 0;
        bool differ = false;
        for (uint32_t r = 0; r < o.ranks; ++r) {
            const uint64_t v = ctl->ranks[r].views[b];
            if (v == 0) continue;
            ++compared;
            if (first == 0) first = v;
            differ |= v != first;
        }
        disagreeing_blocks += differ;
    }
    double fault_max_ms = 0;
    uint64_t went_on_min = UINT64_MAX;
    for (uint32_t r = 0; r < o.ranks && o.fault != Fault::kNone; ++r) {
        const RankOut &x = ctl->ranks[r];
        if (o.fault == Fault::kDie && !x.done) continue; // died with its process
        if (o.fault == Fault::kStall && r == victim_rank) continue;
        fault_max_ms = std::max(fault_max_ms, static_cast<double>(x.fault_max_ns) / 1e6);
        went_on_min = std::min(went_on_min, x.block_at_fault == UINT64_MAX ? 0 : x.last_block - x.block_at_fault);
    }
    const char *fault_name = o.fault == Fault::kRestart ? "restart"
                             : o.fault == Fault::kStall ? "stall"
                             : o.fault == Fault::kDie   ? "die"
                                                        : "none";
    const double fault_s = o.fault_s;
    const RankOut &victim = ctl->ranks[0];
    std::printf("{\"ranks\":%u,\"hosts\":%u,\"procs\":%u,\"rate\":%.0f,\"block\":%llu,\"joined\":%s,\"join_s\":%.2f,"
                "\"failed_procs\":%d,\"stats_ok\":%s,"
                "\"steady_s\":%.2f,\"steady_cmds_per_rank_s\":%.3f,\"steady_evals_per_rank_s\":%.3f,"
                "\"steady_gets_per_rank_s\":%.3f,\"steady_store_cpu_pct\":%.2f,\"steady_rank_cpu_pct\":%.3f,"
                "\"change_s\":%.2f,\"change_cmds_per_rank_s\":%.3f,\"change_store_cpu_pct\":%.2f,"
                "\"clients\":%.0f,\"calls_per_rank_s\":%.1f,\"waits\":%.0f,"
                "\"p50_ns_median\":%.0f,\"p99_ns_median\":%.0f,\"p99_ns_worst\":%.0f,"
                "\"saw_change\":%u,\"agree\":%s,\"agreed_block\":%lld,"
                "\"victim_latency_blocks\":%lld,\"victim_latency_ms\":%.1f,"
                "\"latency_blocks_max\":%.0f,\"latency_ms_median\":%.1f,\"latency_ms_max\":%.1f,"
                "\"views_compared\":%llu,\"disagreeing_blocks\":%llu,\"fault\":\"%s\",\"fault_max_call_ms\":%.1f,"
                "\"fault_blocks_went_on_min\":%lld,\"fault_cmds_per_rank_s\":%.3f,\"fault_store_cpu_pct\":%.2f}\n",
                o.ranks, o.hosts, o.procs, o.rate, static_cast<unsigned long long>(o.block), joined ? "true" : "false", join_s,
                failed_procs, stats_ok ? "true" : "false", steady, (s1.commands - s0.commands) / steady / n,
                (s1.evals - s0.evals) / steady / n, (s1.gets - s0.gets) / steady / n,
                100.0 * (s1.cpu_s - s0.cpu_s) / steady, 100.0 * (c1 - c0) / steady / n, change,
                (s2.commands - s1.commands) / change / n, 100.0 * (s2.cpu_s - s1.cpu_s) / change, s1.clients,
                calls / n / (static_cast<double>(t_stop - join_start) / 1e9), waits, median(p50), median(p99),
                worst_p99, saw_change, agree && saw_change == o.ranks ? "true" : "false",
                agreed_block == UINT64_MAX ? -1LL : static_cast<long long>(agreed_block),
                victim.changed_block == UINT64_MAX ? -1LL
                                                   : static_cast<long long>(victim.changed_block - victim.block_at_change),
                victim.changed_block == UINT64_MAX ? -1.0 : static_cast<double>(victim.changed_ns - t_change) / 1e6,
                lat_blocks.empty() ? -1.0 : *std::max_element(lat_blocks.begin(), lat_blocks.end()), median(lat_ms),
                lat_ms.empty() ? -1.0 : *std::max_element(lat_ms.begin(), lat_ms.end()),
                static_cast<unsigned long long>(compared), static_cast<unsigned long long>(disagreeing_blocks),
                fault_name, fault_max_ms, went_on_min == UINT64_MAX ? -1LL : static_cast<long long>(went_on_min),
                fault_stats ? (f1.commands - f0.commands) / fault_s / n : -1.0,
                fault_stats ? 100.0 * (f1.cpu_s - f0.cpu_s) / fault_s : -1.0);
    (void)c2;
    return failed_procs == 0 && joined ? 0 : 1;
}
