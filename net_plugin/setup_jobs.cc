// SPDX-License-Identifier: Apache-2.0
// The set-up worker thread (setup_jobs.h).
#include "setup_jobs.h"

#include <cerrno>
#include <pthread.h>
#include <unistd.h>

#include "log.h"

namespace vigil::net {

SetupJobs &SetupJobs::process()
{
    static SetupJobs *jobs = new SetupJobs;
    return *jobs;
}

std::shared_ptr<SetupJobs::Job> SetupJobs::run(std::function<int()> fn, std::function<void()> on_done) noexcept
{
    try {
        auto job = std::make_shared<Job>();
        job->fn_ = std::move(fn);
        job->on_done_ = std::move(on_done);
        std::lock_guard<std::mutex> g(mu_);
        const pid_t me = getpid();
        if (owner_ != me) {
            // First job of this process (or of a forked child, where the parent's thread does
            // not exist: its std::thread is left alone, never joined there).
            if (owner_ != 0) (void)new std::thread(std::move(thread_));
            queue_.clear();
            running_ = 0;
            thread_ = std::thread([this] { loop(); });
            owner_ = me;
        }
        queue_.push_back(job);
        cv_.notify_one();
        return job;
    } catch (const std::exception &e) {
        VLOG_WARN("cannot queue set-up work (%s): it runs where it was asked for", e.what());
        return nullptr;
    }
}

size_t SetupJobs::pending() const noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    return queue_.size() + running_;
}

void SetupJobs::loop() noexcept
{
    pthread_setname_np(pthread_self(), "vigil-setup");
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return !queue_.empty(); });
        std::shared_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
        lk.unlock();
        int rc;
        try {
            rc = job->fn_();
        } catch (...) {
            rc = -ENOMEM;
        }
        job->fn_ = nullptr; // what it captured goes here, not with the submitter's handle
        job->rc_ = rc;
        job->done_.store(true, std::memory_order_release);
        if (job->on_done_) {
            try {
                job->on_done_();
            } catch (...) {
            }
            job->on_done_ = nullptr;
        }
        job.reset();
        lk.lock();
        --running_;
    }
}

} // namespace vigil::net
