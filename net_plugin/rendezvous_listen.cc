// SPDX-License-Identifier: Apache-2.0
// The listener's side of the rendezvous, for both fabrics: the process's listening sockets
// (ListenHub), each listener's groups, accept() and the rebuilt paths of the connections it
// produced (Listening), and a receiving connection's acceptor (Accepting).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "rendezvous.h"

namespace vigil::net::rendezvous {

// ---- the hub: one listening socket per device --------------------------------------------------

ListenHub::ListenHub(std::unique_ptr<AcceptSide> side)
    : side_(std::move(side)), failed_(static_cast<size_t>(std::max(side_->devices().count, 0)), 0)
{
}

ListenHub::~ListenHub()
{
    // No listener is left (each holds the hub), so nothing files into one any more.
    if (watched_) {
        ProgressEngine &e = ProgressEngine::instance();
        for (const ListenSocket &l : listening_) e.remove(l.fd.get(), this);
        if (kick_) e.remove(kick_->get(), this);
        e.remove_ticker(this);
        e.quiesce();
    }
}

std::string ListenHub::dev_name(int dev) const
{
    const DeviceAddrs d = side_->devices();
    return dev >= 0 && dev < d.count ? d.name(dev) : std::string("?");
}

int ListenHub::open_locked(int d, bool required)
{
    for (auto it = listening_.begin(); it != listening_.end(); ++it) {
        if (it->dev != d) continue;
        if (failed_[static_cast<size_t>(d)] == 0) return 0;
        // Accepting on it failed for good: a new listener gets a new socket.
        if (watched_) ProgressEngine::instance().remove(it->fd.get(), this);
        listening_.erase(it);
        break;
    }
    const DeviceAddrs devs = side_->devices();
    Endpoint at = devs.addr(d);
    at.port = 0;
    const int fd = make_socket(at.family);
    if (fd < 0) return fd;
    UniqueFd owned(fd);
    sockaddr_storage ss;
    const socklen_t len = at.to_sockaddr(&ss);
    // The backlog holds what the hub does not accept yet (kMaxPending): the kernel caps it at
    // net.core.somaxconn.
    if (::bind(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0 || ::listen(fd, 4096) != 0) {
        const int rc = -errno;
        if (required)
            VLOG_WARN("listen on dev %s %s failed: %s", devs.name(d).c_str(), at.to_string().c_str(),
                      strerror(-rc));
        else
            VLOG_INFO(NCCL_NET, "no backup listener on dev %s: %s", devs.name(d).c_str(),
                      strerror(-rc));
        return rc;
    }
    listening_.push_back(ListenSocket{std::move(owned), d});
    failed_[static_cast<size_t>(d)] = 0;
    ProgressEngine &e = ProgressEngine::instance();
    if (watched_) {
        e.add(fd, this);
    } else if (e.add(fd, this) == 0) {
        // The engine runs (now): it watches every socket, and the hub's timer. While it is
        // stopped (-ENODEV: unit tests), accept() and the acceptors drive the hub, and the
        // next socket opened tries again.
        watched_ = true;
        for (const ListenSocket &l : listening_)
            if (l.fd.get() != fd) e.add(l.fd.get(), this);
        e.add_ticker(this);
        // Without it, arrivals are stepped at the next tick: only slower.
        if (const int k = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); k >= 0) {
            kick_ = std::make_shared<UniqueFd>(k);
            if (e.add(k, this) != 0) kick_.reset();
        }
    }
    return 0;
}

int ListenHub::listen(int dev, const std::array<uint8_t, 16> &nonce, ListenHandle *handle)
{
    const DeviceAddrs devs = side_->devices();
    if (dev < 0 || dev >= devs.count) return -EINVAL;
    std::vector<int> order{dev};
    for (int d = 0; d < devs.count; ++d)
        if (d != dev && order.size() < ListenHandle::kMaxAddrs) order.push_back(d);
    handle->addrs.clear();
    handle->addr_devs.clear();
    std::lock_guard<std::mutex> lock(mu_);
    for (int d : order) {
        if (int rc = open_locked(d, d == dev); rc != 0) {
            if (d == dev) return rc;
            continue;
        }
        for (const ListenSocket &l : listening_) {
            if (l.dev != d) continue;
            sockaddr_storage ss;
            socklen_t len = sizeof(ss);
            getsockname(l.fd.get(), reinterpret_cast<sockaddr *>(&ss), &len);
            Endpoint bound;
            Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&ss), &bound);
            handle->addrs.push_back(bound);
            handle->addr_devs.push_back(static_cast<uint8_t>(d));
        }
    }
    handle->dev = static_cast<uint16_t>(dev);
    handle->nonce = nonce;
    return 0;
}

namespace {

uint64_t nonce_key(const std::array<uint8_t, 16> &nonce)
{
    uint64_t k;
    std::memcpy(&k, nonce.data(), sizeof(k));
    return k;
}

} // namespace

void ListenHub::attach(Listening *l)
{
    std::lock_guard<std::mutex> lock(mu_);
    listeners_.emplace(nonce_key(l->nonce_), l);
}

void ListenHub::detach(Listening *l)
{
    std::lock_guard<std::mutex> lock(mu_);
    auto [b, e] = listeners_.equal_range(nonce_key(l->nonce_));
    for (auto it = b; it != e; ++it) {
        if (it->second != l) continue;
        listeners_.erase(it);
        break;
    }
    std::erase(grouping_, l);
}

Listening *ListenHub::find_locked(const std::array<uint8_t, 16> &nonce) const
{
    // The nonces are random: hashing their first half finds the candidates (nearly always
    // one or none), and the whole nonce is compared in constant time.
    auto [b, e] = listeners_.equal_range(nonce_key(nonce));
    for (auto it = b; it != e; ++it)
        if (nonce_equal(it->second->nonce_, nonce)) return it->second;
    return nullptr;
}

const char *ListenHub::check_locked(const Intro &in, bool *impostor)
{
    Listening *l = find_locked(in.nonce);
    if (l == nullptr) {
        *impostor = true;
        return "wrong nonce";
    }
    // The fabric's decode bounds these; the grouping indexes by them.
    if (in.slot < 0 || in.slot >= kMaxPaths || in.npaths < 1 || in.npaths > kMaxPaths ||
        in.nparts < 1 || in.nparts > 255 || in.part < 0 || in.part >= in.nparts ||
        in.conn_id == 0 || in.path_id == 0)
        return "malformed hello";
    return l->check(in);
}

void ListenHub::refuse_locked(const Arrival &a, const std::string &why, bool impostor)
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

bool ListenHub::step_locked(std::unique_ptr<Arrival> &a, uint64_t now)
{
    std::string why;
    bool impostor = false;
    const int rc = a->step(now, [&](const Intro &in) { return check_locked(in, &impostor); }, &why);
    if (rc != 0) {
        refuse_locked(*a, why, impostor);
        a.reset();
        return false;
    }
    if (!a->done()) return true;
    // Judged when its hello was read; its listener may have closed since.
    Listening *l = find_locked(a->intro().nonce);
    if (l == nullptr) {
        refuse_locked(*a, "its listener closed during set-up");
    } else if (std::string no = l->file(a, now); !no.empty()) {
        refuse_locked(*a, no);
    } else if (std::find(grouping_.begin(), grouping_.end(), l) == grouping_.end()) {
        grouping_.push_back(l);
    }
    a.reset();
    return false;
}

int ListenHub::pump_locked(uint64_t now)
{
    int rc = 0;
    bool capped = false; // stopped at kMaxPending: what waits in a backlog raises no new edge
    for (ListenSocket &ls : listening_) {
        for (;;) {
            if (pending_.size() >= kMaxPending) {
                capped = true;
                break;
            }
            sockaddr_storage ss;
            socklen_t len = sizeof(ss);
            const int fd = ::accept4(ls.fd.get(), reinterpret_cast<sockaddr *>(&ss), &len,
                                     SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                const int err = errno;
                if (err == EMFILE || err == ENFILE) {
                    warn_fd_limit(err, "an accepted connection");
                    capped = true; // the connection waits: try again at the next tick
                    break;
                }
                if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED)
                    break; // nothing now, or transient: try again on the next pump
                VLOG_WARN("dev %s: accept failed: %s", dev_name(ls.dev).c_str(), strerror(err));
                failed_[static_cast<size_t>(ls.dev)] = rc = -err;
                break;
            }
            UniqueFd owned(fd);
            Endpoint peer;
            Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&ss), &peer);
            pending_.push_back(
                side_->arrive(std::move(owned), ls.dev, peer, now + side_->handshake_timeout_ns()));
            if (pending_.back()) pending_.back()->set_wake(waker_locked());
        }
    }
    for (std::unique_ptr<Arrival> &a : pending_)
        if (a) step_locked(a, now);
    std::erase_if(pending_, [](const std::unique_ptr<Arrival> &a) { return !a; });
    std::erase_if(grouping_, [now](Listening *l) { return !l->expire(now); });
    const bool want = capped || !pending_.empty() || !grouping_.empty();
    if (want && !ticking_.exchange(true)) ProgressEngine::instance().wake(this, now);
    ticking_.store(want);
    return rc;
}

void ListenHub::pump(uint64_t now)
{
    std::lock_guard<std::mutex> lock(mu_);
    pump_locked(now);
}

int ListenHub::failed(int dev) const
{
    std::lock_guard<std::mutex> lock(mu_);
    return dev >= 0 && static_cast<size_t>(dev) < failed_.size() ? failed_[static_cast<size_t>(dev)]
                                                                 : 0;
}

std::function<void()> ListenHub::waker_locked() const
{
    if (!kick_) return {};
    return [k = kick_] {
        const uint64_t one = 1;
        // Full (2^64 - 2 kicks unread) or closed: the engine pumps at its tick anyway.
        (void)!::write(k->get(), &one, sizeof one);
    };
}

void ListenHub::arrive(std::unique_ptr<Arrival> a)
{
    std::lock_guard<std::mutex> lock(mu_);
    if (a) a->set_wake(waker_locked());
    if (pending_.size() >= kMaxPending)
        return refuse_locked(*a, "too many connections awaiting their hello");
    if (step_locked(a, now_ns())) {
        pending_.push_back(std::move(a));
        if (!ticking_.exchange(true)) ProgressEngine::instance().wake(this, 0);
    }
}

bool ListenHub::busy() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return !pending_.empty();
}

size_t ListenHub::sockets() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return listening_.size();
}

void ListenHub::on_ready() noexcept
{
    // A connection waits on a listening socket, or an arrival's off-thread work finished
    // (kick_): pump now, not at the next tick.
    std::lock_guard<std::mutex> lock(mu_);
    if (kick_) {
        uint64_t n = 0;
        (void)!::read(kick_->get(), &n, sizeof n);
    }
    pump_locked(now_ns());
}

void ListenHub::on_tick() noexcept
{
    pump(now_ns());
}

uint64_t ListenHub::next_tick_ns() const noexcept
{
    return ticking_.load(std::memory_order_relaxed) ? 0 : kParked;
}

// ---- a listener -----------------------------------------------------------------------------------

Listening::Listening(std::shared_ptr<ListenHub> hub, int dev) : hub_(std::move(hub)), dev_(dev) {}

Listening::~Listening()
{
    hub_->detach(this);
}

int Listening::create(std::shared_ptr<ListenHub> hub, int dev, ListenHandle *handle,
                      std::shared_ptr<Listening> *out)
{
    auto l = std::make_shared<Listening>(std::move(hub), dev);
    if (int rc = random_bytes(l->nonce_.data(), l->nonce_.size()); rc != 0) return rc;
    if (int rc = l->hub_->listen(dev, l->nonce_, handle); rc != 0) return rc;
    l->hub_->attach(l.get());
    *out = std::move(l);
    return 0;
}

int Listening::create(std::unique_ptr<AcceptSide> side, int dev, ListenHandle *handle,
                      std::shared_ptr<Listening> *out)
{
    return create(std::make_shared<ListenHub>(std::move(side)), dev, handle, out);
}

const char *Listening::check(const Intro &in)
{
    std::lock_guard<std::mutex> lock(mu_);
    if (in.rebuild && std::find(served_.begin(), served_.end(), in.conn_id) == served_.end())
        return "path rebuild for an unknown connection";
    return nullptr;
}

Listening::Group *Listening::group_for(const Intro &in)
{
    for (Group &g : groups_)
        if (g.conn_id == in.conn_id && g.rebuild == in.rebuild &&
            (!in.rebuild || g.rebuild_slot == in.slot))
            return &g;
    return nullptr;
}

std::string Listening::file(std::unique_ptr<Arrival> &a, uint64_t now)
{
    std::lock_guard<std::mutex> lock(mu_);
    const AcceptSide &side = hub_->side();
    const Intro &in = a->intro();
    Group *g = group_for(in);
    if (g == nullptr) {
        if (groups_.size() >= kMaxGroups) return "too many connections being set up";
        g = &groups_.emplace_back();
        g->conn_id = in.conn_id;
        g->rebuild = in.rebuild;
        g->rebuild_slot = in.slot;
        g->npaths = in.npaths;
        g->nparts = in.nparts;
        g->peer = a->peer();
        g->deadline_ns = now + side.handshake_timeout_ns();
    }
    const std::string part = side.part_name();
    if (in.nparts != g->nparts || in.npaths != g->npaths)
        return part + " or path count differs from its connection's first " + part;
    Slot &sl = g->slots[static_cast<size_t>(in.slot)];
    if (g->rebuild && sl.count > 0 && sl.path_id != in.path_id) {
        // A newer rebuild attempt of the sender's (one at a time per slot there: the older
        // one ended, e.g. at its handshake timeout under load): its parts replace the
        // older attempt's, which would otherwise hold the group until its deadline and
        // refuse every newer attempt's streams as duplicates.
        VLOG_INFO(NCCL_NET, "dev %s: a newer rebuild of connection %llx's %s path replaces an unfinished one",
                  hub_->dev_name(a->dev()).c_str(), static_cast<unsigned long long>(in.conn_id),
                  in.slot == kPrimary ? "primary" : "backup");
        sl = Slot{};
        g->deadline_ns = now + side.handshake_timeout_ns();
    }
    sl.parts.resize(static_cast<size_t>(g->nparts));
    if (sl.parts[static_cast<size_t>(in.part)])
        return g->nparts > 1 ? "duplicate " + part + " index"
                             : std::string("a second ") +
                                   (in.slot == kPrimary ? "primary" : "backup") +
                                   " path for one connection";
    if (sl.count > 0 && sl.dev != a->dev()) return part + "s of one path on two devices";
    if (sl.count > 0 && sl.path_id != in.path_id) return part + "s of one path disagree on its id";
    sl.dev = a->dev();
    sl.path_id = in.path_id;
    const int other = kMaxPaths - 1 - in.slot;
    if (in.other_dev >= 0 && in.other_dev < side.devices().count)
        g->hint[static_cast<size_t>(other)] = in.other_dev;
    sl.parts[static_cast<size_t>(in.part)] = std::move(a);
    ++sl.count;
    if (g->rebuild && g->complete(g->rebuild_slot)) {
        // A rebuilt path is built at once, whoever pumped the hub: the sender waits for its
        // answer, and the receiving comm may have no timer running (parked).
        const uint64_t conn_id = g->conn_id;
        std::unique_ptr<RecvPath> p = build(*g, g->rebuild_slot);
        *g = Group{};
        std::erase_if(groups_, [](const Group &x) { return x.conn_id == 0; });
        if (p) {
            rebuilt_.push_back({conn_id, std::move(p)});
            for (Accepting *acc : acceptors_)
                if (acc->conn_id_ == conn_id) acc->rebuilt();
        }
    }
    return {};
}

bool Listening::expire_locked(uint64_t now)
{
    for (Group &g : groups_) {
        if (!g.rebuild) {
            // A connection nobody accepts any more (or a late backup) expires; its sockets
            // close. One whose primary accept() saw complete is handed out by accept() once
            // the backup's grace ends: it expires only if accept() stops being called, so a
            // handshake timeout shorter than the grace cannot drop it first.
            const uint64_t until = g.primary_done_ns != 0 ? g.primary_done_ns + 2 * kBackupGraceNs
                                                          : g.deadline_ns + kBackupGraceNs;
            if (now > until) g = Group{};
        } else if (now > g.deadline_ns) {
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return !groups_.empty();
}

bool Listening::expire(uint64_t now)
{
    std::lock_guard<std::mutex> lock(mu_);
    return expire_locked(now);
}

std::unique_ptr<RecvPath> Listening::build(Group &g, int slot)
{
    Slot &sl = g.slots[static_cast<size_t>(slot)];
    const int dev = sl.dev;
    std::string why;
    std::unique_ptr<RecvPath> p = hub_->side().build(slot, dev, std::move(sl.parts), &why);
    sl = Slot{};
    if (!p && g.rebuild)
        VLOG_INFO(NCCL_NET, "dev %s: could not finish a rebuilt path from %s: %s",
                  hub_->dev_name(dev).c_str(), g.peer.to_string().c_str(), why.c_str());
    else if (!p)
        VLOG_WARN("dev %s: could not finish a path from %s: %s", hub_->dev_name(dev).c_str(),
                  g.peer.to_string().c_str(), why.c_str());
    return p;
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
    hub_->side().accepted(&paths);
    *out = std::move(paths);
}

int Listening::accept(RecvPaths *out)
{
    *out = RecvPaths{};
    const uint64_t now = now_ns();
    hub_->pump(now); // before this listener's lock: the hub's comes first
    if (int rc = hub_->failed(dev_); rc != 0) return rc;
    std::lock_guard<std::mutex> lock(mu_);
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
                      hub_->dev_name(dev).c_str(), g.peer.to_string().c_str(), pri.count, g.nparts,
                      hub_->side().part_name());
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    expire_locked(now);
    return 0;
}

bool Listening::take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *out)
{
    hub_->pump(now_ns()); // before this listener's lock: the hub's comes first
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = rebuilt_.begin(); it != rebuilt_.end(); ++it) {
        if (it->conn_id != conn_id) continue;
        *out = std::move(it->path);
        rebuilt_.erase(it);
        return true;
    }
    return false;
}

bool Listening::busy()
{
    if (hub_->busy()) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return !groups_.empty() || !rebuilt_.empty();
}

// ---- the acceptor of one connection ---------------------------------------------------------

Accepting::Accepting(std::shared_ptr<Listening> l, uint64_t conn_id)
    : l_(std::move(l)), conn_id_(conn_id)
{
    // Made by hand_out(), under the listener's lock.
    l_->acceptors_.push_back(this);
}

Accepting::~Accepting()
{
    std::lock_guard<std::mutex> lock(l_->mu_);
    std::erase(l_->acceptors_, this);
    // The connection is gone: a rebuild for it is refused from now on, and a rebuilt path
    // nobody will take any more closes now.
    std::erase(l_->served_, conn_id_);
    std::erase_if(l_->rebuilt_, [this](const Listening::Rebuilt &r) { return r.conn_id == conn_id_; });
}

void Accepting::set_wake(std::function<void()> wake)
{
    std::lock_guard<std::mutex> lock(l_->mu_);
    wake_ = std::move(wake);
}

void Accepting::rebuilt() noexcept
{
    event_.store(true, std::memory_order_release);
    if (wake_) wake_();
}

int Accepting::poll(std::unique_ptr<RecvPath> *out)
{
    const uint64_t now = now_ns();
    const bool event = event_.exchange(false, std::memory_order_acq_rel);
    if (!event && now < next_sweep_ns_) return 0;
    // Once a second as well, a safety net: the hub is driven by its engine timer, and by
    // take_rebuilt() when the engine could not watch it.
    next_sweep_ns_ = now + 1'000'000'000ull;
    l_->take_rebuilt(conn_id_, out);
    return 0;
}

} // namespace vigil::net::rendezvous
