// at::parallel_for for this module's bindings, without resetting the calling thread's torch thread count.
//
// at::parallel_for first runs at::internal::lazy_init_num_threads(), an inline function whose thread_local flag is
// this module's own copy, not torch's: on each thread's first call from this module it runs at::init_num_threads(),
// which applies torch's last set_num_threads from *any* thread (the weight prefetcher sets 1 for itself), so the
// main thread would drop to one thread for every torch op after the first kernel call. Here that first call is
// made once per thread with the thread's count read before and put back after.
#pragma once
#include <ATen/Parallel.h>

namespace flexbatch {

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  thread_local bool ready = false;
  if (!ready) {
    const int threads = at::get_num_threads();  // torch's own, already initialized for this thread
    at::internal::lazy_init_num_threads();
    at::set_num_threads(threads);
    ready = true;
  }
  at::parallel_for(begin, end, grain, f);
}

}  // namespace flexbatch
