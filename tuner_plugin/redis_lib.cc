// SPDX-License-Identifier: Apache-2.0
// hiredis through dlopen: the few entry points the Redis store calls, and the layouts of
// redisContext and redisReply that hiredis has had (0.13, 0.14 and 1.x; 1.x added a
// function table before `err` and `dval`/`vtype` to the reply). Read this way, a 1.x reply
// through 0.x offsets crashes, so the soname decides and the symbols must agree.
#include "redis_lib.h"

#include <dlfcn.h>
#include <sys/time.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>

namespace vigil::tuner {
namespace {

// The three reply layouts (x86_64 LP64), read only through the pointers hiredis returns:
// 0.13 (`len` an int), 0.14 (hiredis.h, v0.14.1:89-96), and 1.x (v1.0.0 on: `dval` after
// `integer`, `vtype` after `str`). Only the fields the store reads are declared.
struct ReplyV013 {
    int type;
    long long integer;
    int len;
    char *str;
    size_t elements;
    ReplyV013 **element;
};
struct ReplyV014 {
    int type;
    long long integer;
    size_t len;
    char *str;
    size_t elements;
    ReplyV014 **element;
};
struct ReplyV1 {
    int type;
    long long integer;
    double dval;
    size_t len;
    char *str;
    char vtype[4];
    size_t elements;
    ReplyV1 **element;
};
// redisContext's leading fields: 0.x starts with `err` (v0.14.1:117-119); 1.x puts its
// function table first (v1.0.0 on).
struct ContextV0 {
    int err;
    char errstr[128];
};
struct ContextV1 {
    const void *funcs;
    int err;
    char errstr[128];
};

enum class Layout { V013, V014, V1 };

struct Api {
    void *(*connect_with_timeout)(const char *ip, int port, const timeval tv);
    int (*set_timeout)(void *ctx, const timeval tv);
    void *(*command_argv)(void *ctx, int argc, const char **argv, const size_t *argvlen);
    int (*append_command_argv)(void *ctx, int argc, const char **argv, const size_t *argvlen);
    int (*get_reply)(void *ctx, void **reply);
    void (*free_reply)(void *reply);
    void (*free_ctx)(void *ctx);
    Layout layout = Layout::V014;
};

constexpr int kRedisOk = 0; // REDIS_OK in every version

struct Loaded {
    Api api{};
    bool ok = false;
    std::string why;
};

template <typename Fn>
bool resolve(void *h, const char *name, Fn *slot, std::string *why)
{
    *slot = reinterpret_cast<Fn>(dlsym(h, name));
    if (*slot == nullptr) *why = std::string("hiredis lacks ") + name;
    return *slot != nullptr;
}

void load(Loaded *out)
{
    // Newest first. The soname fixes the layout; a bare libhiredis.so is not tried, as
    // 0.13 and 0.14 cannot be told apart by their symbols.
    static constexpr struct {
        const char *soname;
        Layout layout;
    } kLibs[] = {{"libhiredis.so.1", Layout::V1},          {"libhiredis.so.1.3.0", Layout::V1},
                 {"libhiredis.so.1.1.0", Layout::V1},      {"libhiredis.so.1.0.1", Layout::V1},
                 {"libhiredis.so.1.0.0", Layout::V1},      {"libhiredis.so.0.14", Layout::V014},
                 {"libhiredis.so.0.13", Layout::V013}};
    void *h = nullptr;
    const char *soname = nullptr;
    std::string last_error;
    for (const auto &l : kLibs) {
        if ((h = dlopen(l.soname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) != nullptr) {
            soname = l.soname;
            out->api.layout = l.layout;
            break;
        }
        const char *e = dlerror();
        if (e != nullptr && std::strstr(e, "cannot open shared object file") == nullptr)
            last_error = e; // present but unusable: worth saying
    }
    if (h == nullptr) {
        out->why = "no hiredis library (libhiredis.so.1, .1.3.0, .1.1.0, .1.0.x, .0.14 or .0.13)";
        if (!last_error.empty()) out->why += ": " + last_error;
        return;
    }
    Api &a = out->api;
    std::string *w = &out->why;
    bool ok = resolve(h, "redisConnectWithTimeout", &a.connect_with_timeout, w) &&
              resolve(h, "redisSetTimeout", &a.set_timeout, w) &&
              resolve(h, "redisCommandArgv", &a.command_argv, w) &&
              resolve(h, "redisAppendCommandArgv", &a.append_command_argv, w) &&
              resolve(h, "redisGetReply", &a.get_reply, w) &&
              resolve(h, "freeReplyObject", &a.free_reply, w) &&
              resolve(h, "redisFree", &a.free_ctx, w);
    // redisConnectWithOptions came with the 1.0 layouts: a library whose soname and symbols
    // disagree is not read with a guessed layout.
    const bool has_options = dlsym(h, "redisConnectWithOptions") != nullptr;
    if (ok && has_options != (a.layout == Layout::V1)) {
        *w = std::string(soname) + (has_options ? " has" : " lacks") +
             " redisConnectWithOptions, unlike its soname's hiredis";
        ok = false;
    }
    out->ok = ok;
}

const Loaded &loaded()
{
    static Loaded state;
    static std::once_flag once;
    std::call_once(once, [] { load(&state); });
    return state;
}

const Api &api()
{
    return loaded().api;
}

int ctx_err(void *ctx)
{
    return api().layout == Layout::V1 ? static_cast<ContextV1 *>(ctx)->err
                                      : static_cast<ContextV0 *>(ctx)->err;
}

std::string ctx_errstr(void *ctx)
{
    const char *s = api().layout == Layout::V1 ? static_cast<ContextV1 *>(ctx)->errstr
                                               : static_cast<ContextV0 *>(ctx)->errstr;
    return std::string(s, strnlen(s, 128));
}

template <typename R>
void copy_reply(const R *r, int depth, RedisReply *out)
{
    out->type = r->type;
    out->integer = r->integer;
    if (r->str != nullptr) out->str.assign(r->str, static_cast<size_t>(r->len));
    if (r->type != RedisReply::kArray || depth >= RedisReply::kMaxDepth) return;
    out->elements.resize(r->elements);
    for (size_t i = 0; i < r->elements; ++i) copy_reply(r->element[i], depth + 1, &out->elements[i]);
}

// Copies hiredis' reply into *out and frees it.
void take_reply(void *raw, RedisReply *out)
{
    *out = RedisReply{};
    switch (api().layout) {
    case Layout::V1: copy_reply(static_cast<const ReplyV1 *>(raw), 0, out); break;
    case Layout::V014: copy_reply(static_cast<const ReplyV014 *>(raw), 0, out); break;
    case Layout::V013: copy_reply(static_cast<const ReplyV013 *>(raw), 0, out); break;
    }
    api().free_reply(raw);
}

struct Argv {
    std::vector<const char *> ptrs;
    std::vector<size_t> lens;
    explicit Argv(const std::vector<std::string_view> &v)
    {
        for (std::string_view s : v) {
            ptrs.push_back(s.data());
            lens.push_back(s.size());
        }
    }
};

} // namespace

bool redis_library(std::string *why)
{
    const Loaded &s = loaded();
    if (!s.ok && why != nullptr) *why = s.why;
    return s.ok;
}

RedisConnection::RedisConnection(RedisConnection &&o) noexcept : ctx_(o.ctx_)
{
    o.ctx_ = nullptr;
}

RedisConnection &RedisConnection::operator=(RedisConnection &&o) noexcept
{
    if (this != &o) {
        close();
        ctx_ = o.ctx_;
        o.ctx_ = nullptr;
    }
    return *this;
}

RedisConnection::~RedisConnection()
{
    close();
}

void RedisConnection::close() noexcept
{
    if (ctx_ != nullptr) api().free_ctx(ctx_);
    ctx_ = nullptr;
}

bool RedisConnection::ok() const noexcept
{
    return ctx_ != nullptr && ctx_err(ctx_) == 0;
}

int RedisConnection::lost(const char *what, std::string *why)
{
    *why = std::string(what) + ": " + (ctx_ != nullptr ? ctx_errstr(ctx_) : "no connection");
    close();
    return -EIO;
}

int RedisConnection::connect(const std::string &host, int port, int timeout_ms, std::string *why)
{
    close();
    if (!redis_library(why)) return -ENOSYS;
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ctx_ = api().connect_with_timeout(host.c_str(), port, tv);
    if (ctx_ == nullptr) {
        *why = "connect: out of memory";
        return -EIO;
    }
    if (ctx_err(ctx_) != 0) return lost("connect", why);
    if (api().set_timeout(ctx_, tv) != kRedisOk) return lost("set timeout", why);
    return 0;
}

int RedisConnection::command(const std::vector<std::string_view> &argv, RedisReply *out,
                             std::string *why)
{
    if (ctx_ == nullptr) return lost("command", why);
    Argv a(argv);
    void *r = api().command_argv(ctx_, static_cast<int>(a.ptrs.size()), a.ptrs.data(),
                                 a.lens.data());
    if (r == nullptr) return lost("command", why);
    take_reply(r, out);
    return 0;
}

int RedisConnection::append(const std::vector<std::string_view> &argv, std::string *why)
{
    if (ctx_ == nullptr) return lost("pipeline", why);
    Argv a(argv);
    if (api().append_command_argv(ctx_, static_cast<int>(a.ptrs.size()), a.ptrs.data(),
                                  a.lens.data()) != kRedisOk)
        return lost("pipeline", why);
    return 0;
}

int RedisConnection::get_reply(RedisReply *out, std::string *why)
{
    if (ctx_ == nullptr) return lost("pipeline", why);
    void *r = nullptr;
    if (api().get_reply(ctx_, &r) != kRedisOk || r == nullptr) return lost("pipeline", why);
    take_reply(r, out);
    return 0;
}

} // namespace vigil::tuner
