// SPDX-License-Identifier: Apache-2.0
// A temporary directory tree for fake sysfs layouts, removed at scope exit.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace vigil::test {

/// Owns a fresh directory under TMPDIR (or /tmp); removes it with everything below.
class TempDir {
public:
    TempDir()
    {
        std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                           std::string("/vigil-verbs-XXXXXX");
        if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~TempDir()
    {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;

    const std::string &path() const { return path_; }
    /// Writes `text` to path()/rel, creating directories.
    void write(const std::string &rel, const std::string &text) const
    {
        const std::filesystem::path p = std::filesystem::path(path_) / rel;
        std::filesystem::create_directories(p.parent_path());
        std::ofstream(p) << text;
    }

private:
    std::string path_;
};

} // namespace vigil::test
