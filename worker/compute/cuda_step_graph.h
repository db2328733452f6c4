// Internal to //worker/compute:cuda_model: what the models (cuda_model.cc) and the optimizers
// and metric sums (cuda_optimizer.cc) share. Built only with --config=cuda.
#ifndef SUBSTRAX_WORKER_COMPUTE_CUDA_STEP_GRAPH_H_
#define SUBSTRAX_WORKER_COMPUTE_CUDA_STEP_GRAPH_H_

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "worker/gpu/cuda_status.h"
#include "worker/gpu/cuda_device.h"

namespace substrax::cuda_internal {

// "(3,)" or "(2, 3)".
inline std::string ShapeString(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// The message is built only on failure: this runs for every launch of every step.
inline absl::Status Kernel(cudaError_t error, const char* kernel, const CudaDevice& device) {
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, absl::StrCat("kernel ", kernel), device.name());
}

// The work one call queues on the device's stream, captured once as a CUDA graph and replayed
// while the addresses it was captured with (its key) stay the same; captured again when they
// change. Replaying one graph costs one launch instead of one per kernel. The first call with a
// new key runs eagerly as a warm-up (cuBLAS picks its kernels and workspace, CUDA loads the
// modules lazily: neither should first happen inside a capture), and a key that changes on
// every call is never captured. A failed capture turns it off for good; each distinct reason
// for launching eagerly goes to stderr once.
class StepGraph {
 public:
  StepGraph(const CudaDevice* device, std::string what) : device_(device), what_(std::move(what)) {}
  ~StepGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Launches the graph of `enqueue` (which queues only capturable work on the device's stream:
  // kernels and cuBLAS calls, no allocation, no synchronisation), capturing it first when `key`
  // differs from the last capture's. False when the caller must launch eagerly instead (a
  // capture failed, now or before; fallback() says why). Errors: CUDA's launching the graph.
  template <typename Enqueue>
  absl::StatusOr<bool> Launch(const std::vector<const void*>& key, Enqueue&& enqueue) {
    if (Broken()) return false;
    if (exec_ == nullptr || key != key_) {
      if (key != warm_key_) {
        warm_key_ = key;
        fallback_ = "warming up: the first call with these buffers runs eagerly";
        return false;
      }
      if (absl::Status s = Capture(enqueue); !s.ok()) {
        broken_ = absl::StrCat("capturing ", what_, " failed (", s.message(), ")");
        Fallback(broken_);
        return false;
      }
      key_ = key;
    }
    fallback_.clear();
    if (const cudaError_t e = cudaGraphLaunch(exec_, device_->stream()); e != cudaSuccess) {
      return CudaStatus(e, absl::StrCat("cudaGraphLaunch of ", what_), device_->name());
    }
    ++replays_;
    return true;
  }

  // True, noting why, once a capture has failed: launch eagerly.
  bool Broken() {
    if (broken_.empty()) return false;
    Fallback(broken_);
    return true;
  }
  // Notes why this call launches eagerly.
  void Fallback(const std::string& reason) {
    fallback_ = reason;
    if (logged_.insert(reason).second) {
      std::fprintf(stderr, "substrax: %s: launching %s eagerly, not as a CUDA graph: %s\n",
                   device_->name().c_str(), what_.c_str(), reason.c_str());
    }
  }

  int64_t replays() const { return replays_; }
  const std::string& fallback() const { return fallback_; }

 private:
  template <typename Enqueue>
  absl::Status Capture(Enqueue& enqueue) {
    cudaStream_t stream = device_->stream();
    // Thread-local mode: the prefetcher's thread may allocate meanwhile; only this thread's
    // unsafe calls would break the capture.
    SUBSTRAX_RETURN_IF_ERROR(
        CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                   "cudaStreamBeginCapture", device_->name()));
    absl::Status status = enqueue();
    cudaGraph_t captured = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &captured);
    if (status.ok()) status = CudaStatus(ended, "cudaStreamEndCapture", device_->name());
    cudaGraphExec_t exec = nullptr;
    if (status.ok()) {
      status = CudaStatus(cudaGraphInstantiate(&exec, captured, 0), "cudaGraphInstantiate",
                          device_->name());
    }
    if (captured != nullptr) cudaGraphDestroy(captured);
    if (!status.ok()) {
      // A failed capture leaves its error for the next cudaGetLastError; it is not the
      // device's, and nothing of it ran.
      cudaGetLastError();
      return status;
    }
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = exec;
    return absl::OkStatus();
  }

  const CudaDevice* const device_;
  const std::string what_;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<const void*> key_;
  std::vector<const void*> warm_key_;  // the key of the last call that ran as a warm-up
  std::string broken_;
  std::string fallback_;
  std::set<std::string> logged_;
  int64_t replays_ = 0;
};

}  // namespace substrax::cuda_internal

#endif  // SUBSTRAX_WORKER_COMPUTE_CUDA_STEP_GRAPH_H_
