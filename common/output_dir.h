// SPDX-License-Identifier: Apache-2.0
// Directories that observability writes into (VIGIL_TELEMETRY_DIR, VIGIL_PROFILE_DIR): made
// when missing, checked before use, never a reason to stop a job.
#pragma once

#include <string>

namespace vigil {

/// Makes `path` a directory this process can write into: missing components are created
/// with mode 0700 (owner-only: the files name hosts, ranks and timings), an existing
/// directory is used as it is. Returns 0, or -errno with *why saying which component and
/// what failed (ENOTDIR: a component is a file; EACCES: not writable). Relative paths are
/// taken from the current directory. Thread-safe (only system calls).
int ensure_output_dir(const std::string &path, std::string *why);

} // namespace vigil
