// SPDX-License-Identifier: Apache-2.0
// mkdir -p with owner-only components, then a write check.
#include "output_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vigil {
namespace {

int fail(int err, const std::string &what, const std::string &path, std::string *why)
{
    *why = what + " " + path + ": " + std::strerror(err);
    return -err;
}

} // namespace

int ensure_output_dir(const std::string &path, std::string *why)
{
    if (path.empty()) return fail(ENOENT, "empty directory name", path, why);
    // Each prefix ending before a '/', then the whole path.
    for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
        const std::string part = pos == std::string::npos ? path : path.substr(0, pos);
        struct stat st {};
        if (!part.empty() && part.back() != '/' && stat(part.c_str(), &st) != 0) {
            if (errno != ENOENT) return fail(errno, "cannot inspect", part, why);
            if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
                return fail(errno, "cannot create", part, why);
            if (stat(part.c_str(), &st) != 0) return fail(errno, "cannot inspect", part, why);
        }
        if (!part.empty() && part.back() != '/' && !S_ISDIR(st.st_mode))
            return fail(ENOTDIR, "not a directory:", part, why);
        if (pos == std::string::npos) break;
    }
    if (access(path.c_str(), W_OK | X_OK) != 0) return fail(errno, "cannot write into", path, why);
    return 0;
}

} // namespace vigil
