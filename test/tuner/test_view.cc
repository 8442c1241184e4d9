// SPDX-License-Identifier: Apache-2.0
// Health records and views: encodings (bounded decoders) and the proposer's aggregate.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "agree_lib.h"
#include "view.h"

using vigil::tuner::test::nic;

using namespace vigil::tuner;

namespace {

MemberRecord member(const char *host, int pid, std::initializer_list<NicHealth> nics)
{
    MemberRecord m;
    m.id = static_cast<uint64_t>(pid) * 7919 + 1;
    std::snprintf(m.host, sizeof(m.host), "%s", host);
    m.pid = pid;
    for (const NicHealth &n : nics) m.nics[m.n_nics++] = n;
    return m;
}

} // namespace

TEST_CASE("view and member encodings round-trip; malformed text is refused", "[view]")
{
    View v;
    v.state = 1;
    v.permille = 250;
    v.degraded_nics = 1;
    v.nodes = 4;
    v.digest = 0xfeedface12345678ull;
    std::snprintf(v.source, sizeof(v.source), "h2/4242/r3");
    View w;
    REQUIRE(decode_view(encode_view(v), &w));
    CHECK(w.same(v));
    CHECK(std::string(w.source) == "h2/4242/r3");
    for (const char *bad : {"", "v1", "v2 1 250 1 0 4 feedface h", "v1 3 250 1 0 4 feedface h", "v1 1 1001 1 0 4 ff h",
                            "v1 1 250 1 0 4 zz h", "v1 1 250 1 0 4 ff h extra", "v1 1 250 1 0 4 ff a:b",
                            "v1 1 250 99999 0 4 ff h"})
        CHECK_FALSE(decode_view(bad, &w));
    CHECK_FALSE(decode_view(std::string(300, 'v'), &w));

    MemberRecord m = member("node-a", 77, {nic("eth0", 0, 1000), nic("eth1", 1, 300)});
    m.progress = 12;
    m.rules_digest = 0xabc;
    m.env_rank = 5;
    MemberRecord n;
    REQUIRE(decode_member(encode_member(m), &n));
    CHECK(n.id == m.id);
    CHECK(std::string(n.host) == "node-a");
    CHECK(n.pid == 77);
    CHECK(n.env_rank == 5);
    CHECK(n.progress == 12);
    CHECK(n.rules_digest == 0xabc);
    REQUIRE(n.n_nics == 2);
    CHECK(std::string(n.nics[1].name) == "eth1");
    CHECK(n.nics[1].state == 1);
    CHECK(n.nics[1].permille == 300);
    std::string enc = encode_member(m);
    CHECK_FALSE(decode_member(enc.substr(0, enc.size() - 3), &n));                           // NIC cut short
    CHECK_FALSE(decode_member(enc + " extra:0:0:0:0:0", &n));                                // count mismatch
    CHECK_FALSE(decode_member("m1 0 h 1 1 1 0 1 0", &n));                                     // id 0
    CHECK_FALSE(decode_member("m1 1 h 1 1 1 0 1 17", &n));                                    // too many NICs
    CHECK_FALSE(decode_member("m1 1 h 1 1 1 0 1 1 eth0:3:0:0:0:0", &n));                      // bad state
    CHECK_FALSE(decode_member(std::string(5000, 'm'), &n));
    // The multipath flag (m2) round-trips; an m1 record (an older member) decodes without it.
    CHECK_FALSE(n.multipath);
    m.multipath = true;
    REQUIRE(decode_member(encode_member(m), &n));
    CHECK(n.multipath);
    REQUIRE(decode_member("m1 1 h 1 1 1 0 1 1 eth0:1:500:0:0:0", &n));
    CHECK_FALSE(n.multipath);
    CHECK(n.nics[0].permille == 500);
    CHECK_FALSE(decode_member("m2 1 h 1 1 1 0 1 1 2 eth0:1:500:0:0:0", &n)); // flag not 0/1
    CHECK_FALSE(decode_member("m2 1 h 1 1 1 0 1 1 eth0:1:500:0:0:0", &n));   // flag missing
}

TEST_CASE("aggregate: a host that stripes keeps the mean of its NICs' fractions", "[view]")
{
    // Host a: eth0 degraded to 0.25, eth1 healthy. Without multipath the slow NIC paces the
    // ring (0.25); with it each NIC carries what it can: (0.25 + 1) / 2, in steps of 50.
    std::vector<MemberRecord> ms = {member("a", 1, {nic("eth0", 1, 250), nic("eth1", 0, 1000)}),
                                    member("b", 2, {nic("eth0", 0, 1000), nic("eth1", 0, 1000)})};
    CHECK(aggregate(ms, nullptr, "x").permille == 250);
    ms[0].multipath = true;
    const View v = aggregate(ms, nullptr, "x");
    CHECK(v.state == 1);
    CHECK(v.permille == 600);
    // A failed NIC with multipath: its share is gone, the other carries on (0.5).
    ms[0].nics[0] = nic("eth0", 2, 0);
    CHECK(aggregate(ms, nullptr, "x").permille == 500);
    // Another member of the host that does not report the flag changes nothing.
    ms.push_back(member("a", 3, {nic("eth0", 2, 0), nic("eth1", 0, 1000)}));
    CHECK(aggregate(ms, nullptr, "x").permille == 500);
}

TEST_CASE("aggregate: worst node, NICs counted once per host, failed NIC share", "[view]")
{
    // Two ranks on host a see eth1 differently (one degraded at 0.4, one at 0.3): the NIC is
    // degraded at 0.3, counted once. Host b has 4 NICs, one failed: 0.75.
    std::vector<MemberRecord> ms = {
        member("a", 1, {nic("eth0", 0, 1000), nic("eth1", 1, 400)}),
        member("a", 2, {nic("eth0", 0, 1000), nic("eth1", 1, 300)}),
        member("b", 3, {nic("eth0", 2, 0), nic("eth1", 0, 1000), nic("eth2", 0, 1000), nic("eth3", 0, 1000)}),
    };
    const View v = aggregate(ms, nullptr, "a/1");
    CHECK(v.state == 2); // failover outranks degraded
    CHECK(v.permille == 300);
    CHECK(v.degraded_nics == 1);
    CHECK(v.failed_nics == 1);
    CHECK(v.nodes == 2);
    CHECK(std::string(v.source) == "a/1");
    ms.pop_back();
    const View d = aggregate(ms, nullptr, "x");
    CHECK(d.state == 1);
    CHECK(d.permille == 300);
    // Order of members does not matter.
    std::swap(ms[0], ms[1]);
    CHECK(aggregate(ms, nullptr, "y").same(d));
    // Steps of 50 permille; in the previous view's episode (same NICs, same state) the
    // fraction only falls, and only by more than one step.
    ms[1].nics[1].permille = 370;
    ms[0].nics[1].permille = 370;
    CHECK(aggregate(ms, nullptr, "z").permille == 350);
    CHECK(aggregate(ms, &d, "z").permille == 300);
    ms[0].nics[1].permille = 1000; // a swing up, a window without a judgement
    ms[1].nics[1].permille = 1000;
    CHECK(aggregate(ms, nullptr, "z").permille == 1000);
    CHECK(aggregate(ms, &d, "z").permille == 300);
    ms[0].nics[1].permille = 250; // one step down: noise
    CHECK(aggregate(ms, &d, "z").permille == 300);
    ms[0].nics[1].permille = 249;
    CHECK(aggregate(ms, &d, "z").permille == 200);
    ms[0].nics[1].permille = 1;
    CHECK(aggregate(ms, &d, "z").permille == 50); // never 0: the view stays a fraction
    // All healthy: digest 0, fraction 1.
    const View h = aggregate({member("a", 1, {nic("eth0", 0, 1000)}), member("b", 2, {})}, nullptr, "q");
    CHECK(h.state == 0);
    CHECK(h.permille == 1000);
    CHECK(h.digest == 0);
    CHECK(aggregate({}, nullptr, "q").same(h));
}

#include <map>

#include "agreement.h"
#include "store.h"

namespace {

// Keeps what a member publishes; registers in a map; counts calls.
class RecordingStore final : public Store
{
public:
    std::vector<MemberRecord> published;
    std::vector<bool> changed;
    std::map<uint64_t, View> regs;
    uint64_t gen = 1;
    int member_reads = 0, proposals = 0, reads = 0;
    std::string describe() const override { return "recording"; }
    int epoch(uint64_t, uint64_t *out) override { *out = 1; return 0; }
    int publish(uint64_t, uint64_t, const MemberRecord &m, bool health_changed, uint32_t, PublishAck *ack) override
    {
        published.push_back(m);
        changed.push_back(health_changed);
        if (health_changed || published.size() == 1) ++gen;
        ack->members = 1;
        ack->digests = 1;
        return 0;
    }
    int members(uint64_t, uint64_t, std::vector<MemberRecord> *out, uint64_t *g) override
    {
        ++member_reads;
        *out = {published.back()};
        *g = gen;
        return 0;
    }
    int digests(uint64_t, uint64_t, std::vector<std::pair<uint64_t, std::string>> *out) override
    {
        out->clear();
        return 0;
    }
    int propose(uint64_t, uint64_t, uint64_t block, const View &p, uint32_t, uint64_t, const std::string &g,
                View *held, bool *found, bool *existed, Slowest *) override
    {
        if (g != std::to_string(gen)) return -ECANCELED;
        ++proposals;
        *existed = regs.count(block) != 0;
        if (!*existed) regs[block] = p;
        held[0] = regs[block];
        found[0] = true;
        return 0;
    }
    int read(uint64_t, uint64_t, uint64_t block, uint32_t, View *out, uint32_t *found) override
    {
        ++reads;
        *found = regs.count(block);
        if (*found) out[0] = regs[block];
        return 0;
    }
    int reassert(uint64_t, uint64_t, const std::vector<uint64_t> &, const std::vector<View> &,
                 uint32_t *conflicts) override
    {
        *conflicts = 0;
        return 0;
    }
    void forget(uint64_t) override {}
};

struct NoSink final : ResolveSink {
    void resolved(uint64_t, const View &, bool, bool) override {}
    void store_event(const std::string &, bool) override {}
};

} // namespace

TEST_CASE("agreement: a member publishes its NICs and whether it stripes", "[view][agree]")
{
    MemberRecord self = member("a", 1, {});
    Agreement a(0x1234, 1, self, Pacing{1, 60'000'000'000});
    RecordingStore store;
    MemberRecord health = member("a", 1, {nic("eth0", 1, 250), nic("eth1", 0, 1000)});
    health.multipath = true;
    NoSink sink;
    a.step(store, health, true, 1, sink);
    REQUIRE_FALSE(store.published.empty());
    CHECK(store.published[0].multipath);
    CHECK(store.published[0].n_nics == 2);
    CHECK(store.published[0].nics[0].permille == 250);
}

TEST_CASE("agreement: a member publishes on change and heartbeat, and reads members only when they changed",
          "[view][agree]")
{
    MemberRecord self = member("a", 1, {});
    const uint64_t beat = 60'000'000'000;
    Agreement a(0x1234, 1, self, Pacing{1, beat});
    RecordingStore store;
    NoSink sink;
    const MemberRecord ok = member("a", 1, {nic("eth0", 0, 1000)});
    uint64_t now = 1;
    // Joins: one publication, one member read for the first proposal.
    a.step(store, ok, true, now, sink);
    REQUIRE(store.published.size() == 1);
    CHECK(store.member_reads == 1);
    // 2000 blocks of calls with the same health, one health read per block: no publication
    // but every kProgressStep blocks, and no member read however many proposals.
    for (uint64_t b = 1; b <= 2000; ++b) {
        a.set_progress(b);
        now += 1'000'000; // 1 ms a block: the heartbeat is not due
        a.step(store, ok, true, now, sink);
    }
    CHECK(a.resolved() >= 2001);
    CHECK(store.published.size() == 1 + 2000 / kProgressStep);
    CHECK(store.member_reads == 1);
    // Noise below the view's step is no change; a degraded NIC is, once.
    MemberRecord noisy = ok;
    noisy.nics[0].permille = 980;
    a.step(store, noisy, true, now, sink);
    CHECK(store.published.size() == 1 + 2000 / kProgressStep);
    MemberRecord bad = member("a", 1, {nic("eth0", 1, 250)});
    a.set_progress(2001);
    a.step(store, bad, true, now, sink);
    a.step(store, bad, true, now, sink);
    REQUIRE(store.published.size() == 2 + 2000 / kProgressStep);
    CHECK(store.changed.back());
    // The generation moved: the next proposal reads the members again and carries the change.
    CHECK(store.member_reads == 2);
    CHECK(a.view_at(a.resolved() - 1)->state == 1);
    // The heartbeat republishes an unchanged record, as no change.
    now += beat;
    a.step(store, bad, true, now, sink);
    CHECK(store.published.size() == 3 + 2000 / kProgressStep);
    CHECK_FALSE(store.changed.back());
}
