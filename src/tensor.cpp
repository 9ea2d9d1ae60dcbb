#include "flashlite/tensor.h"

#include <string>

#include "common/half.h"
#include "common/problem.h"
#include "flashlite/errors.h"

namespace flashlite {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
  }
  return "unknown";
}

std::string device_name(Device device) {
  return device.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(device.index);
}

static TensorView make_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape) {
  if (shape.size() > size_t(kMaxRank)) {
    throw Error(ErrorKind::invalid_value, "tensor rank " + std::to_string(shape.size()) + " exceeds the maximum of 4");
  }
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = int(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  return t;
}

TensorView TensorView::contiguous(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape) {
  TensorView t = make_view(data, dtype, device, shape);
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.strides[i] = stride;
    stride *= t.shape[i];
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides) {
  if (strides.size() != shape.size()) {
    throw Error(ErrorKind::invalid_value, "strides has " + std::to_string(strides.size()) + " entries but shape has " +
                                              std::to_string(shape.size()));
  }
  TensorView t = make_view(data, dtype, device, shape);
  int i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

size_t TensorView::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) last += (shape[i] - 1) * (strides[i] < 0 ? -strides[i] : strides[i]);
  return size_t(last + 1) * dtype_size(dtype);
}

std::string TensorView::shape_string() const {
  // No iostreams: error messages are built inside host processes (Python with torch loaded) where an ostringstream
  // crashed (seen on the GPU machine); std::to_string needs no locale.
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

float load_as_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::i32: return float(static_cast<const int32_t*>(base)[index]);
  }
  return 0.f;
}

void store_from_float(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[index] = value; break;
    case DType::f16: static_cast<uint16_t*>(base)[index] = float_to_fp16(value); break;
    case DType::bf16: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); break;
    case DType::i32: static_cast<int32_t*>(base)[index] = int32_t(value); break;
  }
}

}  // namespace flashlite
