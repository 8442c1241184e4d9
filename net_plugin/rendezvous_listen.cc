// SPDX-License-Identifier: Apache-2.0
// The listener's side of the rendezvous, for both fabrics: set-up sockets, groups, accept()
// and the rebuilt paths of the connections it produced.
#include <algorithm>
#include <cerrno>

#include "clock.h"
#include "log.h"
#include "rendezvous.h"

namespace vigil::net::rendezvous {

int Listening::create(std::unique_ptr<AcceptSide> side, int dev, ListenHandle *handle,
                      std::shared_ptr<Listening> *out)
{
    auto l = std::make_shared<Listening>(std::move(side));
    if (int rc = listen_on(dev, l->side_->devices(), handle, &l->listening_, &l->nonce_); rc != 0)
        return rc;
    *out = std::move(l);
    return 0;
}

std::string Listening::dev_name(int dev) const
{
    const DeviceAddrs d = side_->devices();
    return dev >= 0 && dev < d.count ? d.name(dev) : std::string("?");
}

std::vector<int> Listening::listening_fds() const
{
    // listening_ is fixed once create() returns: no lock needed.
    std::vector<int> fds;
    for (const ListenSocket &l : listening_) fds.push_back(l.fd.get());
    return fds;
}

const char *Listening::check(const Intro &in, bool *impostor)
{
    if (!nonce_equal(in.nonce, nonce_)) {
        *impostor = true;
        return "wrong nonce";
    }
    // The fabric's decode bounds these; the grouping below indexes by them.
    if (in.slot < 0 || in.slot >= kMaxPaths || in.npaths < 1 || in.npaths > kMaxPaths ||
        in.nparts < 1 || in.nparts > 255 || in.part < 0 || in.part >= in.nparts ||
        in.conn_id == 0 || in.path_id == 0)
        return "malformed hello";
    if (in.rebuild && std::find(served_.begin(), served_.end(), in.conn_id) == served_.end())
        return "path rebuild for an unknown connection";
    return nullptr;
}

void Listening::refuse(const Arrival &a, const std::string &why, bool impostor)
{
    // One WARN per impostor connection, not one per path or stream. A failure the fabric
    // expects (a rebuild while a port heals) is INFO.
    if (impostor && !refusals_.first(a.intro().conn_id)) return;
    if (side_->quiet_failure(a))
        VLOG_INFO(NCCL_NET, "dev %s: path set-up from %s failed: %s", dev_name(a.dev()).c_str(),
                  a.peer().to_string().c_str(), why.c_str());
    else
        VLOG_WARN("dev %s: rejected connection from %s: %s; still listening",
                  dev_name(a.dev()).c_str(), a.peer().to_string().c_str(), why.c_str());
}

bool Listening::step(std::unique_ptr<Arrival> &a, uint64_t now)
{
    std::string why;
    bool impostor = false;
    const int rc = a->step(now, [&](const Intro &in) { return check(in, &impostor); }, &why);
    if (rc != 0) {
        refuse(*a, why, impostor);
        a.reset();
        return false;
    }
    if (!a->done()) return true;
    file(std::move(a), now);
    return false;
}

Listening::Group *Listening::group_for(const Intro &in)
{
    for (Group &g : groups_)
        if (g.conn_id == in.conn_id && g.rebuild == in.rebuild &&
            (!in.rebuild || g.rebuild_slot == in.slot))
            return &g;
    return nullptr;
}

// Files a finished arrival under its connection, slot and part.
void Listening::file(std::unique_ptr<Arrival> a, uint64_t now)
{
    const Intro &in = a->intro();
    Group *g = group_for(in);
    if (g == nullptr) {
        if (groups_.size() >= kMaxGroups) return refuse(*a, "too many connections being set up");
        g = &groups_.emplace_back();
        g->conn_id = in.conn_id;
        g->rebuild = in.rebuild;
        g->rebuild_slot = in.slot;
        g->npaths = in.npaths;
        g->nparts = in.nparts;
        g->peer = a->peer();
        g->deadline_ns = now + side_->handshake_timeout_ns();
    }
    const std::string part = side_->part_name();
    if (in.nparts != g->nparts || in.npaths != g->npaths)
        return refuse(*a, part + " or path count differs from its connection's first " + part);
    Slot &sl = g->slots[static_cast<size_t>(in.slot)];
    if (g->rebuild && sl.count > 0 && sl.path_id != in.path_id) {
        // A newer rebuild attempt of the sender's (one at a time per slot there: the older
        // one ended, e.g. at its handshake timeout under load): its parts replace the
        // older attempt's, which would otherwise hold the group until its deadline and
        // refuse every newer attempt's streams as duplicates.
        VLOG_INFO(NCCL_NET, "dev %s: a newer rebuild of connection %llx's %s path replaces an unfinished one",
                  dev_name(a->dev()).c_str(), static_cast<unsigned long long>(in.conn_id),
                  in.slot == kPrimary ? "primary" : "backup");
        sl = Slot{};
        g->deadline_ns = now + side_->handshake_timeout_ns();
    }
    sl.parts.resize(static_cast<size_t>(g->nparts));
    if (sl.parts[static_cast<size_t>(in.part)])
        return refuse(*a, g->nparts > 1 ? "duplicate " + part + " index"
                                        : std::string("a second ") +
                                              (in.slot == kPrimary ? "primary" : "backup") +
                                              " path for one connection");
    if (sl.count > 0 && sl.dev != a->dev())
        return refuse(*a, part + "s of one path on two devices");
    if (sl.count > 0 && sl.path_id != in.path_id)
        return refuse(*a, part + "s of one path disagree on its id");
    sl.dev = a->dev();
    sl.path_id = in.path_id;
    const int other = kMaxPaths - 1 - in.slot;
    if (in.other_dev >= 0 && in.other_dev < side_->devices().count)
        g->hint[static_cast<size_t>(other)] = in.other_dev;
    sl.parts[static_cast<size_t>(in.part)] = std::move(a);
    ++sl.count;
}

std::unique_ptr<RecvPath> Listening::build(Group &g, int slot)
{
    Slot &sl = g.slots[static_cast<size_t>(slot)];
    const int dev = sl.dev;
    std::string why;
    std::unique_ptr<RecvPath> p = side_->build(slot, dev, std::move(sl.parts), &why);
    sl = Slot{};
    if (!p && g.rebuild)
        VLOG_INFO(NCCL_NET, "dev %s: could not finish a rebuilt path from %s: %s",
                  dev_name(dev).c_str(), g.peer.to_string().c_str(), why.c_str());
    else if (!p)
        VLOG_WARN("dev %s: could not finish a path from %s: %s", dev_name(dev).c_str(),
                  g.peer.to_string().c_str(), why.c_str());
    return p;
}

int Listening::pump(uint64_t now)
{
    const int rc = accept_all(
        listening_, side_->devices(), [this] { return pending_.size(); },
        [&](UniqueFd fd, int dev, const Endpoint &peer) {
            pending_.push_back(
                side_->arrive(std::move(fd), dev, peer, now + side_->handshake_timeout_ns()));
        });
    if (rc != 0) return rc;
    for (std::unique_ptr<Arrival> &a : pending_)
        if (a) step(a, now);
    std::erase_if(pending_, [](const std::unique_ptr<Arrival> &a) { return !a; });
    for (Group &g : groups_) {
        if (g.conn_id == 0) continue;
        if (!g.rebuild) {
            // A connection nobody accepts any more (or a late backup) expires; its sockets
            // close. One whose primary accept() saw complete is handed out by accept() once
            // the backup's grace ends: it expires only if accept() stops being called, so a
            // handshake timeout shorter than the grace cannot drop it first.
            const uint64_t until = g.primary_done_ns != 0 ? g.primary_done_ns + 2 * kBackupGraceNs
                                                          : g.deadline_ns + kBackupGraceNs;
            if (now > until) g = Group{};
            continue;
        }
        if (g.complete(g.rebuild_slot)) {
            if (std::unique_ptr<RecvPath> p = build(g, g.rebuild_slot))
                rebuilt_.push_back({g.conn_id, std::move(p)});
            g = Group{};
        } else if (now > g.deadline_ns) {
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return 0;
}

// Every wanted part is here (or the backup's grace ran out): build the paths and hand them out.
void Listening::hand_out(Group &g, RecvPaths *out)
{
    RecvPaths paths;
    for (int k = 0; k < kMaxPaths; ++k) {
        const size_t ks = static_cast<size_t>(k);
        paths.devs[ks] = g.hint[ks];
        if (!g.complete(k)) continue; // a late backup: dropped, the connector notices
        const int dev = g.slots[ks].dev;
        std::unique_ptr<RecvPath> p = build(g, k);
        if (!p && k == kPrimary) {
            g = Group{};
            return;
        }
        if (!p) continue;
        paths.devs[ks] = dev;
        paths.paths[ks] = std::move(p);
    }
    const uint64_t conn_id = g.conn_id;
    g = Group{};
    served_.push_back(conn_id);
    paths.acceptor = std::make_unique<Accepting>(shared_from_this(), conn_id);
    side_->accepted(&paths);
    *out = std::move(paths);
}

int Listening::accept(RecvPaths *out)
{
    *out = RecvPaths{};
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t now = now_ns();
    if (int rc = pump(now); rc != 0) return rc;
    for (Group &g : groups_) {
        if (g.conn_id == 0 || g.rebuild) continue;
        if (g.complete(kPrimary)) {
            if (g.primary_done_ns == 0) g.primary_done_ns = now;
            if (g.npaths == 1 || g.complete(kBackup) || now - g.primary_done_ns > kBackupGraceNs) {
                hand_out(g, out);
                if (out->paths[kPrimary]) break;
            }
        } else if (now > g.deadline_ns) {
            const Slot &pri = g.slots[kPrimary];
            const int dev = pri.dev >= 0 ? pri.dev : g.slots[kBackup].dev;
            VLOG_WARN("dev %s: dropped a connection from %s: %zu of %d primary %ss arrived in time",
                      dev_name(dev).c_str(), g.peer.to_string().c_str(), pri.count, g.nparts,
                      side_->part_name());
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return 0;
}

bool Listening::take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *out)
{
    std::lock_guard<std::mutex> lock(mu_);
    pump(now_ns());
    for (auto it = rebuilt_.begin(); it != rebuilt_.end(); ++it) {
        if (it->conn_id != conn_id) continue;
        *out = std::move(it->path);
        rebuilt_.erase(it);
        return true;
    }
    return false;
}

void Listening::arrive(std::unique_ptr<Arrival> a)
{
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.size() >= kMaxPending)
        return refuse(*a, "too many connections awaiting their hello");
    if (step(a, now_ns())) pending_.push_back(std::move(a));
}

bool Listening::busy()
{
    std::lock_guard<std::mutex> lock(mu_);
    return !pending_.empty() || !groups_.empty() || !rebuilt_.empty();
}

// ---- the acceptor of one connection ---------------------------------------------------------

Accepting::Accepting(std::shared_ptr<Listening> l, uint64_t conn_id)
    : l_(std::move(l)), conn_id_(conn_id), fds_(l_->listening_fds())
{
    for (int fd : fds_) ProgressEngine::instance().add(fd, this);
}

Accepting::~Accepting()
{
    for (int fd : fds_) ProgressEngine::instance().remove(fd, this);
    ProgressEngine::instance().quiesce();
}

int Accepting::poll(std::unique_ptr<RecvPath> *out)
{
    const uint64_t now = now_ns();
    const bool event = event_.exchange(false, std::memory_order_acq_rel);
    if (!event && now < next_sweep_ns_ && !l_->busy()) return 0;
    next_sweep_ns_ = now + 1'000'000'000ull;
    l_->take_rebuilt(conn_id_, out);
    return 0;
}

} // namespace vigil::net::rendezvous
