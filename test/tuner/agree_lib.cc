// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the agreement tests and the tuner benchmark.
#include "agree_lib.h"
#include "redis_lib.h"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace vigil::tuner::test {

void ScriptedHealth::read(MemberRecord *rec)
{
    const double t = static_cast<double>(now_ns() - t0_) / 1e9;
    const Step *cur = nullptr;
    for (const Step &s : steps_)
        if (s.at_s <= t) cur = &s;
    rec->n_nics = 0;
    if (cur == nullptr) return;
    for (const NicHealth &n : cur->nics)
        if (rec->n_nics < kMaxNics) rec->nics[rec->n_nics++] = n;
}

NicHealth nic(const char *name, uint8_t state, uint16_t permille)
{
    NicHealth n;
    std::snprintf(n.name, sizeof(n.name), "%s", name);
    n.state = state;
    n.permille = permille;
    return n;
}

void fill_table(int coll, uint64_t bytes, float *t)
{
    for (int k = 0; k < 21; ++k) t[k] = -1.0f;
    const double b = static_cast<double>(bytes);
    t[1 * 3 + 0] = static_cast<float>(28.8 + b / 4e3);   // ring/ll
    t[1 * 3 + 1] = static_cast<float>(40.0 + b / 9e3);   // ring/ll128
    t[1 * 3 + 2] = static_cast<float>(131.6 + b / 12e3); // ring/simple
    if (coll == 4) {
        t[0 * 3 + 0] = static_cast<float>(25.2 + b / 3e3);  // tree/ll
        t[0 * 3 + 2] = static_cast<float>(60.0 + b / 10e3); // tree/simple
    }
}

LatencyModel default_model()
{
    LatencyModel m;
    const double base[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
    const double nvl[2][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
    const double net[2][3] = {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}};
    for (int a = 0; a < 2; ++a)
        for (int p = 0; p < 3; ++p) {
            m.base[a][p] = base[a][p];
            m.hw[0][a][p] = nvl[a][p];
            m.hw[2][a][p] = net[a][p];
        }
    m.valid = true;
    return m;
}

CommInfo comm_info(uint64_t comm, size_t nranks, size_t nnodes, int abi)
{
    CommInfo info;
    info.comm = comm;
    info.has_comm = true;
    info.nranks = nranks;
    info.nnodes = nnodes;
    info.abi = abi;
    info.model = default_model();
    return info;
}

uint64_t pack(const Choice &c, int channels, uint64_t chunk)
{
    return static_cast<uint64_t>(c.algo + 1) | static_cast<uint64_t>(c.proto + 1) << 4 |
           static_cast<uint64_t>(channels & 0xff) << 8 | (chunk / 16) << 16;
}

bool RedisServer::available()
{
    return access("/usr/bin/redis-server", X_OK) == 0;
}

bool RedisServer::start(std::string *why, std::vector<std::string> extra)
{
    extra_ = std::move(extra);
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (s < 0 || bind(s, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
        *why = std::string("no free port: ") + std::strerror(errno);
        if (s >= 0) close(s);
        return false;
    }
    port_ = ntohs(a.sin_port);
    close(s);
    char tmpl[] = "/tmp/vigil-redis-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return *why = "mkdtemp failed", false;
    dir_ = tmpl;
    return spawn(why);
}

bool RedisServer::restart(std::string *why)
{
    stop();
    return spawn(why);
}

bool RedisServer::spawn(std::string *why)
{
    const std::string port = std::to_string(port_);
    // argv before fork: the child of a threaded process must not allocate.
    std::vector<const char *> argv = {"redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", dir_.c_str(), "--protected-mode", "yes"};
    for (const std::string &a : extra_) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
        // Ends with its starter, even one killed before it could stop the server.
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        const int devnull = ::open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv("/usr/bin/redis-server", const_cast<char *const *>(argv.data()));
        _exit(127);
    }
    if (pid_ < 0) return *why = "fork failed", false;
    // Ready when it answers PING (at most 5 s).
    for (int i = 0; i < 500; ++i) {
        RedisConnection c;
        RedisReply r;
        std::string ignored;
        if (c.connect("127.0.0.1", port_, 100, &ignored) == 0 && c.command({"PING"}, &r, &ignored) == 0 &&
            r.type == RedisReply::kStatus)
            return true;
        int st = 0;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
            pid_ = -1;
            return *why = "redis-server exited at start", false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    *why = "redis-server did not answer within 5 s";
    return false;
}

void RedisServer::stop()
{
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        int st = 0;
        waitpid(pid_, &st, 0);
        pid_ = -1;
    }
}

std::string install_rules(const std::string &text)
{
    char path[] = "/tmp/vigil-tuner-rules-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return "";
    const ssize_t w = write(fd, text.data(), text.size());
    close(fd);
    if (w != static_cast<ssize_t>(text.size())) return "";
    setenv("NCCL_TUNER_CONFIG_FILE", path, 1);
    return path;
}

} // namespace vigil::tuner::test
