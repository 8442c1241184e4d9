// SPDX-License-Identifier: Apache-2.0
// vigil-tunerbench: the cost of the tuner's getCollInfo per call, side by side in one run:
//   pass-through   no rules, no agreed view (NCCL's choice untouched)
//   rules          20 rules (the last one matches), steering off
//   rules + view   the same rules plus an agreed degraded view: every call re-estimates the
//                  cost table (no rule matches) within one block
//   view change    every call starts a new block (block size 1), some with a view that
//                  differs from the previous block's (timed one call at a time, the timer's
//                  own cost subtracted; the median of the changed ones is printed too)
// and the system calls the calling thread makes on that path, counted with a seccomp filter
// that traps every system call of the thread (SIGSYS; the call is then skipped and counted).
// Not a test: prints medians and ratios (scripts/bench.sh may run it).
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "agree_lib.h"
#include "tuner.h"

using namespace vigil::tuner;
using namespace vigil::tuner::test;

namespace {

std::atomic<uint64_t> g_syscalls{0};

void on_sigsys(int, siginfo_t *, void *ctx)
{
    g_syscalls.fetch_add(1, std::memory_order_relaxed);
    // Skip the call: make it return -ENOSYS (x86-64 RAX; aarch64 X0).
    auto *uc = static_cast<ucontext_t *>(ctx);
#if defined(__x86_64__)
    uc->uc_mcontext.gregs[REG_RAX] = -ENOSYS;
#elif defined(__aarch64__)
    uc->uc_mcontext.regs[0] = static_cast<unsigned long long>(-ENOSYS);
#endif
}

// From here on every system call of this thread traps, except what the handler's return
// and the thread's own exit need (rt_sigreturn, madvise, exit): the hot path makes none of
// those. Everything the measuring thread needs is allocated before.
bool trap_syscalls()
{
    struct sigaction sa{};
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGSYS, &sa, nullptr) != 0) return false;
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigreturn, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
    return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC * 0, &prog) == 0;
}

inline uint64_t ticks()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); // vDSO: no system call
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Case {
    const char *name;
    double median_ns = 0;
    uint64_t syscalls = 0;
    uint64_t calls = 0;
};

const char *kRules = "allgather,0,-1,ring,ll128,2,-1,-1\n"
                     "broadcast,0,-1,ring,simple,-1,-1,-1\n";

std::string many_rules()
{
    std::string r;
    for (int i = 0; i < 19; ++i) r += "reducescatter," + std::to_string(i * 1000) + "," + std::to_string(i * 1000 + 999) + ",ring,ll,-1,-1,-1\n";
    return r + "allreduce,0,-1,ring,simple,-1,-1,-1,-1,-1,healthy\n";
}

Context *open_ctx(Tuner &t, bool agree, uint64_t t0)
{
    CommInfo info;
    uint64_t comm = 0;
    getrandom(&comm, sizeof(comm), 0);
    info.comm = comm | 1;
    info.has_comm = agree;
    info.nranks = 1;
    info.nnodes = 2;
    info.abi = 7;
    info.model = default_model();
    Context *c = nullptr;
    std::string why;
    // A view that changes every 20 ms between two degraded fractions.
    std::vector<ScriptedHealth::Step> steps;
    for (int i = 0; i < 12000; ++i)
        steps.push_back({i * 0.005, {nic("eth0", 1, i % 2 ? 250 : 500), nic("eth1", 0, 1000)}});
    if (t.open(info, std::make_unique<ScriptedHealth>(t0, steps), &c, &why) != 0) {
        std::fprintf(stderr, "open: %s\n", why.c_str());
        std::exit(1);
    }
    return c;
}

constexpr int kBatches = 200, kPerBatch = 5000;
std::vector<float> g_tables(static_cast<size_t>(kPerBatch) * 21);
std::vector<double> g_samples;

// Batches of kPerBatch calls on one size; the per-call median over batches. Allocates
// nothing (g_tables, g_samples are sized before the filter).
Case batched(const char *name, Context *c)
{
    const int batches = kBatches, per_batch = kPerBatch;
    Case k{name};
    std::vector<double> &per_call = g_samples;
    per_call.clear();
    float base[21];
    fill_table(4, 1 << 20, base);
    std::vector<float> &tables = g_tables;
    const uint64_t sys0 = g_syscalls.load();
    for (int b = 0; b < batches; ++b) {
        for (int i = 0; i < per_batch; ++i) std::memcpy(&tables[static_cast<size_t>(i) * 21], base, sizeof(base));
        const uint64_t t0 = ticks();
        for (int i = 0; i < per_batch; ++i) {
            int ch = 0;
            c->get_coll_info(4, 1 << 20, 1, &tables[static_cast<size_t>(i) * 21], 7, 3, 0, &ch);
        }
        per_call.push_back(static_cast<double>(ticks() - t0) / per_batch);
    }
    k.syscalls = g_syscalls.load() - sys0;
    k.calls = static_cast<uint64_t>(batches) * static_cast<uint64_t>(per_batch);
    std::nth_element(per_call.begin(), per_call.begin() + static_cast<long>(per_call.size() / 2), per_call.end());
    k.median_ns = per_call[per_call.size() / 2];
    return k;
}

} // namespace

int main()
{
    const std::string rules_file = install_rules(std::string(kRules) + many_rules());
    const uint64_t t0 = now_ns();

    // Each setting in its own tuner (configuration is per process for NCCL).
    Config off;
    off.store = "none";
    off.block = 128;
    Config view = off;
    view.store = "shm";
    view.block = 1u << 30; // one block: the common path
    Config change = view;
    change.block = 1;
    change.lookahead = 64;
    change.publish_ms = 5;

    setenv("NCCL_TUNER_CONFIG_FILE", "/nonexistent/no-rules", 1);
    Tuner t_pass(off);
    Context *pass = open_ctx(t_pass, false, t0);
    setenv("NCCL_TUNER_CONFIG_FILE", rules_file.c_str(), 1);
    Tuner t_rules(off), t_view(view), t_change(change);
    Context *rules = open_ctx(t_rules, false, t0);
    Context *viewc = open_ctx(t_view, true, t0);
    Context *changec = open_ctx(t_change, true, t0);
    // The first block's view needs the store: wait until it is resolved (not timed).
    while (viewc->resolved_blocks() == 0 || changec->resolved_blocks() < 64) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    {
        float table[21];
        fill_table(4, 1 << 20, table);
        int ch = 0;
        viewc->get_coll_info(4, 1 << 20, 1, table, 7, 3, 0, &ch); // enter block 0
        while (viewc->current_view().state != 1) { // a degraded view: the re-estimate runs
            std::fprintf(stderr, "waiting for a degraded view\n");
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            break;
        }
    }
    std::vector<Case> cases;
    Case vc{"view change"};
    uint64_t changes = 0;
    size_t vc_samples = 0;
    std::vector<double> changed_samples;
    changed_samples.reserve(20000);
    bool trapped = false;
    cases.reserve(16);
    g_samples.reserve(20000);
    std::thread measure([&] { // its own thread: the seccomp filter applies to it alone
        trapped = trap_syscalls();
        // The counter must see a system call: one deliberate getppid, then start from 0.
        syscall(SYS_getppid);
        trapped = trapped && g_syscalls.exchange(0) == 1;
        for (int round = 0; round < 3; ++round) { // interleaved, so machine noise hits all alike
            cases.push_back(batched("pass-through", pass));
            cases.push_back(batched("rules", rules));
            cases.push_back(batched("rules + view", viewc));
        }
        // View change: one call per block, each timed alone; the tuner thread keeps 64
        // blocks ahead and this loop spins (no system call) until the next is resolved.
        std::vector<double> &samples = g_samples;
        samples.clear();
        uint64_t empty = UINT64_MAX;
        for (int i = 0; i < 1000; ++i) {
            const uint64_t a = ticks();
            empty = std::min(empty, ticks() - a);
        }
        float base[21];
        fill_table(4, 1 << 20, base);
        const uint64_t sys0 = g_syscalls.load();
        View prev = changec->current_view();
        for (int i = 0; i < 20000; ++i) {
            while (changec->resolved_blocks() <= changec->calls() + 1) {
            }
            float table[21];
            std::memcpy(table, base, sizeof(table));
            int ch = 0;
            const uint64_t a = ticks();
            changec->get_coll_info(4, 1 << 20, 1, table, 7, 3, 0, &ch);
            const uint64_t d = ticks() - a;
            samples.push_back(static_cast<double>(d > empty ? d - empty : 0));
            if (!prev.same(changec->current_view())) {
                ++changes;
                changed_samples.push_back(samples.back());
            }
            prev = changec->current_view();
        }
        vc.syscalls = g_syscalls.load() - sys0;
        vc_samples = samples.size();
        vc.calls = samples.size();
        std::nth_element(samples.begin(), samples.begin() + static_cast<long>(samples.size() / 2), samples.end());
        vc.median_ns = samples[samples.size() / 2];
    });
    measure.join();
    std::printf("# view change: every timed call enters a new block; %llu of %zu entered one whose view differed "
                "from the last: median %.1f ns for those\n",
                static_cast<unsigned long long>(changes), vc_samples,
                changed_samples.empty() ? 0.0 : median(changed_samples));
    std::printf("# getCollInfo cost per call (median ns), system calls of the calling thread%s\n",
                trapped ? " (seccomp trap)" : " (NOT COUNTED: seccomp unavailable)");
    std::printf("%-14s %10s %10s %12s %14s\n", "case", "median_ns", "ratio", "calls", "syscalls");
    auto agg = [&](const char *name) {
        Case k{name};
        std::vector<double> m;
        for (const Case &c : cases)
            if (std::strcmp(c.name, name) == 0) m.push_back(c.median_ns), k.syscalls += c.syscalls, k.calls += c.calls;
        k.median_ns = median(m);
        return k;
    };
    const Case p = agg("pass-through"), r = agg("rules"), v = agg("rules + view");
    for (const Case &k : {p, r, v, vc})
        std::printf("%-14s %10.1f %10.2f %12llu %14llu\n", k.name, k.median_ns, k.median_ns / p.median_ns,
                    static_cast<unsigned long long>(k.calls), static_cast<unsigned long long>(k.syscalls));
    std::fflush(stdout);
    t_pass.close(pass);
    t_rules.close(rules);
    t_view.close(viewc);
    t_change.close(changec);
    unlink(rules_file.c_str());
    const bool ok = trapped && p.syscalls + r.syscalls + v.syscalls + vc.syscalls == 0 && v.median_ns <= 1000 &&
                    vc.median_ns <= 1000;
    std::printf("{\"ok\":%s,\"pass_ns\":%.1f,\"rules_ns\":%.1f,\"rules_view_ns\":%.1f,\"view_change_ns\":%.1f,"
                "\"syscalls\":%llu}\n",
                ok ? "true" : "false", p.median_ns, r.median_ns, v.median_ns, vc.median_ns,
                static_cast<unsigned long long>(p.syscalls + r.syscalls + v.syscalls + vc.syscalls));
    std::fflush(stdout);
    return ok ? 0 : 1;
}
