// SPDX-License-Identifier: Apache-2.0
// hiredis opened at run time: the tuner never links it, so the plugins load on nodes without
// it, and any hiredis a distribution ships (0.13 to 1.x) serves VIGIL_TUNER_STORE=redis://.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vigil::tuner {

/// One Redis reply, copied out of hiredis' own structure (whose layout differs between
/// hiredis 0.x and 1.x). `type` uses hiredis' REDIS_REPLY_* numbers, the same in every
/// version for the RESP2 types below. Plain data; arrays nest at most kMaxDepth deep.
struct RedisReply {
    static constexpr int kString = 1, kArray = 2, kInteger = 3, kNil = 4, kStatus = 5,
                         kError = 6;
    static constexpr int kMaxDepth = 4;
    int type = kNil;
    long long integer = 0;
    std::string str;                  ///< kString, kStatus, kError
    std::vector<RedisReply> elements; ///< kArray
};

/// A blocking connection to one Redis server through the loaded hiredis. Move-only; not
/// thread-safe (one user at a time, as a redisContext).
class RedisConnection {
public:
    RedisConnection() = default;
    RedisConnection(RedisConnection &&) noexcept;
    RedisConnection &operator=(RedisConnection &&) noexcept;
    ~RedisConnection();

    /// Connects to host:port within `timeout_ms` and bounds every later command by it.
    /// Returns 0, or -EIO with *why (hiredis' error text), -ENOSYS when hiredis is not
    /// loadable (see redis_library()).
    int connect(const std::string &host, int port, int timeout_ms, std::string *why);
    /// Whether a connection is open and hiredis has reported no error on it.
    bool ok() const noexcept;
    /// Drops the connection.
    void close() noexcept;

    /// Sends one command (argv with lengths) and waits for its reply. Returns 0 with *out
    /// filled, or -EIO with *why; after -EIO the connection is closed.
    int command(const std::vector<std::string_view> &argv, RedisReply *out, std::string *why);
    /// Queues one command without waiting (redisAppendCommandArgv). 0 or -EIO with *why.
    int append(const std::vector<std::string_view> &argv, std::string *why);
    /// Waits for the next queued command's reply. 0 or -EIO with *why.
    int get_reply(RedisReply *out, std::string *why);

private:
    int lost(const char *what, std::string *why);
    void *ctx_ = nullptr; // redisContext of the loaded hiredis
};

/// Opens hiredis on the first call (the sonames of hiredis 1.x, then 0.14, then 0.13; the
/// soname gives the structure layout, and the library's symbols must agree with it).
/// Returns true, or false with *why naming the library and the reason. Thread-safe; the
/// answer is fixed after the first call.
bool redis_library(std::string *why);

} // namespace vigil::tuner
