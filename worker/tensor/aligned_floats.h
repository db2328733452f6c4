// AlignedFloats: a float vector whose storage starts on a 64-byte boundary (a cache line; an
// AVX-512 vector), for the buffers the CPU kernels write: the flat gradient buffers.
//
// Why: Eigen peels scalar iterations until a destination is aligned, and those coefficients are
// computed in another order (or without the fused multiply-add) than the vectorized ones. With
// every buffer the kernels write starting on the same boundary, where a coefficient falls
// depends only on its index, never on where the allocator put the buffer: runs repeat bit for
// bit (a resumed run equals an uninterrupted one; the explicit and the sharding paths agree).
#ifndef SUBSTRAX_WORKER_TENSOR_ALIGNED_FLOATS_H_
#define SUBSTRAX_WORKER_TENSOR_ALIGNED_FLOATS_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace substrax {

inline constexpr std::size_t kKernelAlignment = 64;
// Floats per kKernelAlignment bytes.
inline constexpr int64_t kAlignedFloats = kKernelAlignment / sizeof(float);

template <typename T>
struct KernelAllocator {
  using value_type = T;

  KernelAllocator() = default;
  template <typename U>
  KernelAllocator(const KernelAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kKernelAlignment}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{kKernelAlignment}); }

  friend bool operator==(const KernelAllocator&, const KernelAllocator&) { return true; }
  friend bool operator!=(const KernelAllocator&, const KernelAllocator&) { return false; }
};

using AlignedFloats = std::vector<float, KernelAllocator<float>>;

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_TENSOR_ALIGNED_FLOATS_H_
