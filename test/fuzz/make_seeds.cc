// SPDX-License-Identifier: Apache-2.0
// fuzz-seeds OUTDIR: writes the seed corpora of the fuzz targets whose inputs Vigil's own
// encoders and writers produce in-process, into OUTDIR/<target>/: listen handles, the TCP and
// verbs wire formats, hello sequences for the TCP listener, environments of VIGIL_* values,
// tuner rules files and telemetry registry segments. Each seed is a valid input, or a valid
// one with one field broken (near-valid), named after what it holds. The report's seeds come
// from a run of the plugin (test/fuzz/make_corpus.sh). Deterministic: no clock or random
// value reaches a seed, except the registry's own header fields (pid, host, start time).
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "handle.h"
#include "params.h"
#include "rules.h"
#include "tcp/wire.h"
#include "telemetry/registry.h"
#include "verbs/verbs_wire.h"

namespace vn = vigil::net;
namespace tcp = vigil::net::tcp;
namespace vw = vigil::net::verbs_fabric;
namespace tel = vigil::telemetry;

namespace {

using Bytes = std::vector<uint8_t>;

std::string g_out;

void put(const std::string &target, const std::string &name, const Bytes &b)
{
    const std::string dir = g_out + "/" + target;
    mkdir(dir.c_str(), 0755);
    std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!f) {
        std::fprintf(stderr, "fuzz-seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
        std::exit(1);
    }
}

void put_text(const std::string &target, const std::string &name, const std::string &text)
{
    put(target, name, Bytes(text.begin(), text.end()));
}

// ---- listen handle ---------------------------------------------------------------------

vn::Endpoint endpoint(int family, uint8_t last, uint16_t port)
{
    vn::Endpoint e;
    e.family = family;
    e.port = port;
    if (family == AF_INET)
        e.addr = {10, 77, 0, last};
    else
        e.addr = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last};
    return e;
}

Bytes handle_bytes(const vn::ListenHandle &h)
{
    Bytes b(vn::ListenHandle::kSize);
    if (h.encode(b.data()) != 0) std::abort();
    return b;
}

// Recomputes the checksum after a field was broken, so the decoder reaches that field.
void reseal(Bytes &b)
{
    const uint32_t sum = vn::fnv1a32(b.data(), 104);
    for (int i = 0; i < 4; ++i)
        b[104 + static_cast<size_t>(i)] = static_cast<uint8_t>(sum >> (8 * i));
}

void handles()
{
    vn::ListenHandle h;
    h.dev = 3;
    for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<uint8_t>(0x40 + i);
    h.addrs = {endpoint(AF_INET, 2, 43000)};
    put("handle", "valid-1-ipv4", handle_bytes(h));
    h.addrs = {endpoint(AF_INET, 2, 43000), endpoint(AF_INET6, 3, 43001), endpoint(AF_INET, 4, 1),
               endpoint(AF_INET6, 5, 65535)};
    h.addr_devs = {3, 0, 1, 2};
    const Bytes four = handle_bytes(h);
    put("handle", "valid-4-mixed", four);
    struct Break {
        const char *name;
        size_t at;
        uint8_t value;
    };
    const Break breaks[] = {
        {"bad-version", 4, 2},         {"count-0", 5, 0},    {"count-5", 5, 5},
        {"bad-family", 24, 5},         {"zero-port", 26, 0}, {"ipv4-padding", 24 + 8 + 3, 1},
        {"scratch-ignored", 110, 0xff}};
    for (const Break &k : breaks) {
        Bytes b = four;
        b[k.at] = k.value;
        if (k.at == 26) b[27] = 0;
        reseal(b);
        put("handle", std::string(k.at == 110 ? "valid-" : "near-") + k.name, b);
    }
    Bytes b = four;
    b[20] ^= 1; // nonce changed, checksum not
    put("handle", "near-bad-checksum", b);
    h.addrs.resize(2);
    h.addr_devs.resize(2);
    b = handle_bytes(h);
    b[24 + 2 * 20 + 3] = 7; // an unused entry not zero
    reseal(b);
    put("handle", "near-unused-entry", b);
}

// ---- TCP wire ----------------------------------------------------------------------------

tcp::Hello hello(uint8_t nstreams, uint8_t stream, int kind, int npaths, bool rebuild,
                 uint64_t conn, uint64_t path)
{
    tcp::Hello h;
    h.nstreams = nstreams;
    h.stream = stream;
    h.path_kind = tcp::make_path_kind(kind, npaths, rebuild);
    h.conn_id = conn;
    h.path_id = path;
    return h;
}

template <class T> Bytes encoded(const T &t, size_t size)
{
    Bytes b(size);
    t.encode(b.data());
    return b;
}

void tcp_wire()
{
    put("tcp-wire", "hello-primary",
        encoded(hello(2, 1, 0, 2, false, 0x1111, 0x2222), tcp::Hello::kSize));
    put("tcp-wire", "hello-rebuild-16",
        encoded(hello(16, 15, 1, 2, true, 0x1111, 0x3333), tcp::Hello::kSize));
    Bytes b = encoded(hello(2, 1, 0, 1, false, 0x1111, 0x2222), tcp::Hello::kSize);
    b[6] = 2; // stream == nstreams
    put("tcp-wire", "near-hello-stream", b);

    tcp::FrameHeader f;
    f.kind = tcp::FrameHeader::kData;
    f.entry = 7;
    f.gen = 3;
    f.tag = -5;
    f.seq = 99;
    f.size = 1 << 20;
    f.offset = 1 << 19;
    f.len = 1 << 19;
    b = encoded(f, 48);
    put("tcp-wire", "frame-data", b);
    b[32] = 1; // chunk one byte past its message
    put("tcp-wire", "near-frame-outside", b);
    f.kind = tcp::FrameHeader::kGeneration;
    f.entry = 1;
    f.path = 0xabcdef;
    f.size = f.offset = f.len = 0;
    put("tcp-wire", "frame-generation", encoded(f, tcp::FrameHeader::kSize));
    f.kind = tcp::FrameHeader::kProbe;
    f.path = 0;
    put("tcp-wire", "frame-probe", encoded(f, tcp::FrameHeader::kSize));
    f.kind = tcp::FrameHeader::kData;
    f.size = 4096;
    f.len = 4096;
    f.offset = 0;
    b = encoded(f, 48);
    tcp::put_le(b.data() + 40, 1000, 8); // the limit below the message
    put("tcp-wire", "near-frame-limit", b);

    tcp::BackHeader k;
    k.kind = tcp::BackHeader::kCts;
    k.count = 8;
    k.value = 12;
    put("tcp-wire", "back-cts", encoded(k, tcp::BackHeader::kSize));
    k.kind = tcp::BackHeader::kAck;
    k.count = 0;
    k.arg = 4;
    k.value = 1000;
    put("tcp-wire", "back-ack", encoded(k, tcp::BackHeader::kSize));
    k.kind = tcp::BackHeader::kFailoverRequest;
    k.count = 1;
    put("tcp-wire", "near-back-count", encoded(k, tcp::BackHeader::kSize));
    std::array<tcp::Landed, 3> landed{{{7, 262144, 2}, {8, 4096, 2}, {9, 0xffffffffu, 3}}};
    Bytes lb(48 + tcp::BackHeader::kMaxBytes - tcp::BackHeader::kSize, 0);
    tcp::encode_landed(landed.data(), landed.size(), 1'795'000'000'000'000'000ull, &k, lb.data() + 48);
    k.encode(lb.data());
    put("tcp-wire", "back-landed", lb);
}

// Records of the listener target: a control byte, then a hello whose nonce bytes are the
// XOR with the listener's nonce (zeros: the right one).
void hello_record(Bytes &out, uint8_t ctl, const tcp::Hello &h)
{
    out.push_back(ctl);
    const Bytes b = encoded(h, tcp::Hello::kSize);
    out.insert(out.end(), b.begin(), b.end());
}

void tcp_hello()
{
    constexpr uint8_t kDev1 = 1, kAccept = 2, kPoll = 4;
    Bytes b;
    hello_record(b, 0, hello(2, 0, 0, 1, false, 7, 70));
    hello_record(b, kAccept, hello(2, 1, 0, 1, false, 7, 70));
    put("tcp-hello", "primary-2-streams", b);
    b.clear();
    hello_record(b, 0, hello(1, 0, 0, 2, false, 8, 80));
    hello_record(b, kDev1 | kAccept, hello(1, 0, 1, 2, false, 8, 81));
    put("tcp-hello", "primary-and-backup", b);
    hello_record(b, kDev1 | kPoll, hello(1, 0, 1, 2, true, 8, 82));
    put("tcp-hello", "backup-rebuilt", b);
    b.clear();
    hello_record(b, 0, hello(3, 0, 0, 1, false, 9, 90));
    hello_record(b, 0, hello(3, 0, 0, 1, false, 9, 90));
    hello_record(b, kDev1, hello(3, 1, 0, 1, false, 9, 90));
    hello_record(b, 0, hello(2, 2, 0, 1, false, 9, 90));
    hello_record(b, kAccept, hello(3, 2, 0, 1, false, 9, 91));
    put("tcp-hello", "near-duplicate-and-mismatch", b);
    b.clear();
    tcp::Hello wrong = hello(1, 0, 0, 1, false, 10, 100);
    wrong.nonce[3] = 1;
    hello_record(b, kAccept, wrong);
    hello_record(b, kAccept | kPoll, hello(1, 0, 0, 1, true, 10, 101));
    put("tcp-hello", "near-wrong-nonce-unknown-rebuild", b);
}

// ---- verbs wire ----------------------------------------------------------------------------

vw::PathEnd path_end(uint8_t nqps)
{
    vw::PathEnd e;
    e.nqps = nqps;
    e.mtu = 3;
    e.psn = 0x123456;
    for (uint8_t i = 0; i < 16; ++i) e.gid[i] = static_cast<uint8_t>(0xfe - i);
    for (uint8_t i = 0; i < nqps; ++i) e.qpn[i] = 0x11 + i;
    e.ring_addr = 0x7f0000001000;
    e.ctl_addr = 0x7f0000002000;
    e.rkey = 0x1234;
    return e;
}

void verbs_wire()
{
    vw::Hello h;
    h.slot = 1;
    h.npaths = 2;
    h.conn_id = 0x55;
    h.path_id = 0x66;
    h.peer_dev = 1;
    h.other_dev = 0;
    h.end = path_end(4);
    Bytes b = encoded(h, vw::Hello::kSize);
    put("verbs-wire", "hello", b);
    b[48] = 17; // 17 QPs
    put("verbs-wire", "near-hello-qps", b);
    vw::Answer a;
    a.end = path_end(16);
    put("verbs-wire", "answer", encoded(a, vw::Answer::kSize));
    a.status = static_cast<uint32_t>(-12);
    put("verbs-wire", "answer-refusal", encoded(a, vw::Answer::kSize));
    put("verbs-wire", "path-end", encoded(path_end(1), vw::PathEnd::kSize));

    vw::Ctl c;
    c.kind = vw::Ctl::kCts;
    c.count = 3;
    c.a = 5;
    c.b = 100;
    b = encoded(c, vw::Ctl::kSize + 3 * vw::Ctl::kEntrySize);
    put("verbs-wire", "ctl-cts-3", b);
    b.resize(b.size() - 1);
    put("verbs-wire", "near-ctl-cts-short", b);
    c.kind = vw::Ctl::kHolding;
    c.count = 0;
    put("verbs-wire", "ctl-holding", encoded(c, vw::Ctl::kSize + vw::Ctl::kBitmapBytes));
    c.kind = vw::Ctl::kGeneration;
    c.count = 2;
    put("verbs-wire", "ctl-notice", encoded(c, vw::Ctl::kSize));
    c.kind = vw::Ctl::kHeartbeat;
    c.count = 0;
    put("verbs-wire", "ctl-heartbeat", encoded(c, vw::Ctl::kSize));

    vw::Record r;
    r.seq = 0x100000007;
    r.gen = 2;
    r.size = 65536;
    r.tag = 9;
    r.entry = 7;
    b = encoded(r, vw::kRecordBytes + 8);
    const size_t at = vw::kRecordBytes; // the immediate follows the record
    vw::put_le(b.data() + at, 7, 4);    // the immediate: low 29 bits of seq
    put("verbs-wire", "record", b);
    vw::put_le(b.data() + at, 8, 4);
    put("verbs-wire", "near-record-imm", b);
    r.offset = 32768; // a striped message's last piece
    b = encoded(r, vw::kRecordBytes + 8);
    vw::put_le(b.data() + at, 7, 4);
    put("verbs-wire", "record-last-piece", b);
    vw::put_le(b.data() + at, vw::PieceImm::encode(0x1234, 9, 5), 4);
    vw::put_le(b.data() + at + 4, 8200, 4); // the path's latest generation
    put("verbs-wire", "piece-imm", b);
    vw::put_le(b.data() + at, vw::ShortImm::encode(0x1234567, 3), 4);
    put("verbs-wire", "short-imm", b);
    b = encoded(r, vw::kRecordBytes + 16);
    vw::put_le(b.data() + at, vw::CtlImm::control(0x10000005), 4);
    put("verbs-wire", "ctl-imm", b);
    vw::put_le(b.data() + at, vw::CtlImm::credit(0x0fffffff), 4); // across the 28-bit wrap
    vw::put_le(b.data() + at + 8, 0x10000010, 8);                 // control messages written
    put("verbs-wire", "credit-imm", b);
}

// ---- VIGIL_* environments -------------------------------------------------------------------

void params()
{
    std::string all;
    for (const vigil::ParamSpec &s : vigil::param_specs())
        all += std::string(s.name) + "=" + std::string(s.default_text) + "\n";
    put_text("params", "defaults", all);
    put_text("params", "suffixes",
             "VIGIL_CHUNK_BYTES=512K\nVIGIL_SOCKET_BUF_BYTES=4MiB\nVIGIL_TELEMETRY_MAX_BYTES=1G\n"
             "VIGIL_PROFILE_MAX_BYTES=64gib\nVIGIL_NSTREAMS=16\nVIGIL_ABORT_ON_ERROR=yes\nVIGIL_"
             "TELEMETRY=off\n");
    put_text("params", "near-out-of-range",
             "VIGIL_NSTREAMS=17\nVIGIL_CHUNK_BYTES=4095\nVIGIL_WINDOW_US=-1\nVIGIL_MAX_RECVS=8x\n"
             "VIGIL_TELEMETRY=maybe\nVIGIL_SPEED_MBPS=99999999999999999999\nVIGIL_NO_SUCH=1\n");
    put_text("params", "strings",
             "VIGIL_SOCKET_IFNAME=^=docker0,lo\nVIGIL_SOCKET_FAMILY=AF_INET6\nVIGIL_BACKUP=eth0:"
             "eth1,eth1:eth0\n"
             "VIGIL_INJECT_FAIL=eth0:bytes=1G\nVIGIL_PROFILE_EVENTS=coll,net,proxy-step\n"
             "VIGIL_TUNER_STORE=redis://[::1]:6379\nVIGIL_IB_HCA=^=mlx5_1:1,mlx5_4\n"
             "VIGIL_IB_ADDR_RANGE=10.10.0.0/16\nVIGIL_IB_ADDR_FAMILY=AF_INET\n");
    put_text(
        "params", "near-strings",
        "VIGIL_SOCKET_IFNAME=eth0,,=\nVIGIL_BACKUP=eth0:eth0\nVIGIL_INJECT_FAIL=eth9:msgs=\n"
        "VIGIL_PROFILE_EVENTS=4096\nVIGIL_TUNER_STORE=redis://host:0\nVIGIL_IB_HCA=mlx5_0:256\n"
        "VIGIL_IB_ADDR_RANGE=10.10.0.0/33\n");
    // Findings, kept as regression inputs: long numbers once overflowed an int.
    put_text("params", "regress-ib-hca-port",
             "VIGIL_IB_HCA=mlx5_0:25\xca\xf5VIGIL_IB_ADDR_RANGE=10.10.0\n");
    put_text("params", "regress-ib-addr-range-bits", "VIGIL_IB_ADDR_RANGE=10.0.0.0/99999999999\n");
}

// ---- tuner rules ---------------------------------------------------------------------------

void rules()
{
    vigil::tuner::Rule r;
    r.coll = 4;
    r.min_bytes = 0;
    r.max_bytes = 65536;
    r.algo = 1;
    r.proto = 0;
    r.channels = 8;
    std::string text = "# collective,min,max,algorithm,protocol,channels,nNodes,nRanks[,...]\n";
    text += vigil::tuner::format_rule(r) + "\n";
    r.min_bytes = 65537;
    r.max_bytes = UINT64_MAX;
    r.proto = 2;
    r.nodes = 2;
    r.ranks = 16;
    r.pipe_ops = 1;
    r.reg_buff = 0;
    r.health = vigil::tuner::HealthMatch::kDegraded;
    r.chunk = 131072;
    text += vigil::tuner::format_rule(r) + "\r\n";
    text += "  allgather, 0, 1048576, nvls_tree, ll128, -1, -1, -1, -1, 1, failover\n\n";
    put_text("rules", "valid", text);
    put_text("rules", "near-min-above-max", "allreduce,10,9,ring,simple,4,1,8\n");
    put_text("rules", "near-fields", "broadcast,0,-1,tree,ll,65,1,8,1,0,any,1073741825,extra\n");
}

// ---- telemetry registry -------------------------------------------------------------------

// This process's real segment with two paths and a few windows, cut to `entries` entries
// (max_paths patched to match: a 128-entry segment is 4 MB).
void registry()
{
    tel::Registry &reg = tel::Registry::instance();
    if (reg.open(1'000'000, 3) != 0) {
        std::fprintf(stderr, "fuzz-seeds: cannot create a registry segment in /dev/shm\n");
        std::exit(1);
    }
    tel::PathEntry *a = reg.acquire(0, 0, 0, "eth0", "10.77.0.2:41000", "10.77.0.3:5000", 0x42);
    tel::PathEntry *b =
        reg.acquire(1, 1, 1, "eth1-with-a-long-name", "[fd00::2]:41001", "[fd00::3]:5001", 0x42);
    for (uint64_t i = 0; i < 300; ++i) { // more than a ring: the oldest are overwritten
        tel::WindowRecord w{};
        w.seq = i;
        w.start_ns = 1'000'000 * i;
        w.window_us = 1000;
        w.generation = 1;
        w.bytes = 1 << 20;
        w.ops = 4;
        w.busy_ns = 900'000;
        w.degraded = i > 250;
        w.baseline_bps = 2'000'000'000;
        w.judged_bps = w.degraded ? 500'000'000 : 0;
        tel::ring_push(*a, w);
        if (i < 10) tel::ring_push(*b, w);
    }
    b->state.store(tel::kDead);
    std::ifstream f(reg.path(), std::ios::binary);
    const std::string seg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    unlink(reg.path().c_str());
    for (uint32_t n : {1u, 2u}) {
        Bytes s(seg.begin(), seg.begin() + static_cast<std::ptrdiff_t>(tel::registry_bytes(n)));
        auto *h = reinterpret_cast<tel::RegistryHeader *>(s.data());
        h->max_paths = n;
        put("registry", "segment-" + std::to_string(n) + "-paths", s);
        if (n != 1) continue;
        put("registry", "near-truncated", Bytes(s.begin(), s.end() - 1));
        h->paths_used.store(200);
        put("registry", "paths-used-beyond", s);
        h->version = 2;
        put("registry", "near-version", s);
    }
}

} // namespace

int main(int argc, char **argv)
{
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz-seeds OUTDIR\n");
        return 2;
    }
    g_out = argv[1];
    mkdir(g_out.c_str(), 0755);
    handles();
    tcp_wire();
    tcp_hello();
    verbs_wire();
    params();
    rules();
    registry();
    return 0;
}
