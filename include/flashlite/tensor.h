#pragma once
// Non-owning tensor views (like DLPack's DLTensor). Owning memory is the caller's job.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashlite {

enum class DType : uint8_t { f32, f16, bf16, i32 };
enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool operator==(const Device&) const = default;
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
std::string device_name(Device device);

inline constexpr int kMaxRank = 4;

// A strided view. Shapes and strides are in elements, not bytes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};

  // Row-major contiguous view of `shape`.
  static TensorView contiguous(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);
  // View with explicit strides (same length as shape).
  static TensorView strided(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides);

  int64_t numel() const;
  bool empty() const { return data == nullptr && rank == 0; }
  // Bytes spanned from the lowest to one past the highest addressed element (0 when numel() == 0).
  size_t span_bytes() const;
  std::string shape_string() const;
};

}  // namespace flashlite
