// SPDX-License-Identifier: Apache-2.0
// Registration: whole pages, cached while any user holds them; DMA-BUF never cached.
#include "hca.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>

namespace vigil::net::verbs_fabric {
namespace {

size_t page_size()
{
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

} // namespace

int Hca::open(const verbs::Context *ctx, std::string name)
{
    ctx_ = ctx;
    name_ = std::move(name);
    return verbs::Pd::alloc(*ctx, &pd_);
}

int Hca::reg(void *data, size_t size, std::shared_ptr<FabricMr> *out)
{
    const uintptr_t p = reinterpret_cast<uintptr_t>(data);
    const uintptr_t begin = p & ~(page_size() - 1);
    const uintptr_t end = (p + std::max<size_t>(size, 1) + page_size() - 1) & ~(page_size() - 1);
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry &e : cache_) {
        if (e.begin > begin || e.end < end) continue;
        if (std::shared_ptr<FabricMr> mr = e.mr.lock()) {
            *out = std::move(mr);
            return 0;
        }
    }
    std::erase_if(cache_, [](const Entry &e) { return e.mr.expired(); });
    auto mr = std::make_shared<VerbsMr>();
    if (int rc = verbs::Mr::reg(pd_, reinterpret_cast<void *>(begin), end - begin, kAccess, &mr->mr); rc != 0)
        return rc;
    mr->lkey = mr->mr.lkey();
    mr->rkey = mr->mr.rkey();
    cache_.push_back(Entry{begin, end, mr});
    *out = std::move(mr);
    return 0;
}

int Hca::reg_dmabuf(void *data, size_t size, uint64_t offset, int fd, std::shared_ptr<FabricMr> *out)
{
    auto mr = std::make_shared<VerbsMr>();
    if (int rc = verbs::Mr::reg_dmabuf(pd_, offset, size, reinterpret_cast<uintptr_t>(data), fd, kAccess, &mr->mr);
        rc != 0)
        return rc;
    mr->lkey = mr->mr.lkey();
    mr->rkey = mr->mr.rkey();
    *out = std::move(mr);
    return 0;
}

size_t Hca::cached() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(std::count_if(cache_.begin(), cache_.end(), [](const Entry &e) { return !e.mr.expired(); }));
}

} // namespace vigil::net::verbs_fabric
