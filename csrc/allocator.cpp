// torch's CPU allocator, replaced by one whose freed blocks glibc's malloc can hand out again.
//
// torch allocates CPU tensors with posix_memalign(64). glibc (2.36 here) serves that from a block
// 96 bytes larger than asked and gives the two slivers either side back to the thread's cache of
// small blocks (tcache), where they stay marked in use. Freed, the tensor's block then cannot merge
// with its neighbours and is 96 bytes too small for the next tensor of the same size: even with
// malloc keeping freed memory (imagegen.tuning.allocator.keep_freed_memory), each large tensor came
// from fresh pages again and again (the numerator's forward at 16,384 positions faulted in all of
// its 64 MB output at most calls, and the heap grew by as much). This allocator asks malloc for the
// size plus 64 bytes and aligns inside the block, keeping malloc's own pointer just below the data:
// a freed block is exactly what the next request of that size asks for, so it is reused.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>

#include "cpu_kernel.h"

namespace {
constexpr std::uintptr_t kAlignment = 64;  // torch's own (c10::gAlignment)

void release(void* data) {
  if (data) std::free(static_cast<void**>(data)[-1]);
}

struct RecyclingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    // malloc's pointer is 16-byte aligned, so the data starts 16 to 64 bytes into the block
    void* raw = std::malloc(n + kAlignment);
    TORCH_CHECK(raw, "CPU out of memory: could not allocate ", n, " bytes");
    auto* data = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(raw) + sizeof(void*) + kAlignment - 1) &
                                         ~(kAlignment - 1));
    static_cast<void**>(data)[-1] = raw;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
}  // namespace

bool use_recycling_allocator() {
  static RecyclingAllocator allocator;
  c10::SetCPUAllocator(&allocator, /*priority=*/1);
  return c10::GetCPUAllocator() == &allocator;
}
