// onnx_custom_ext::my_add(a, b) = 2 * a + b, registered with the PyTorch dispatcher (no Python binding:
// the library is loaded with torch.ops.load_library and called as torch.ops.onnx_custom_ext.my_add).
// Its spec (onnx_custom/ops/extension.py) adopts this op: the schema below must be the spec's.
#include <torch/library.h>
#include <ATen/ATen.h>

namespace {

at::Tensor my_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  // Same checks (and wording) as onnx_custom.ops.extension.check_my_add_inputs.
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(),
      "onnx_custom_ext::my_add expects a and b of the same shape, got a ", a.sizes(), " and b ", b.sizes());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(),
      "onnx_custom_ext::my_add expects a and b of the same dtype, got a ", a.scalar_type(),
      " and b ", b.scalar_type());
  // The spec's dtype list (onnx_custom/ops/extension.py): floats and ints, as onnx_custom::my_add.
  bool supported = false;
  switch (a.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kByte:
      supported = true;
      break;
    default:
      break;
  }
  TORCH_CHECK_TYPE(supported,
      "onnx_custom_ext::my_add expects tensors of float32, float64, float16, bfloat16, int8, int16, int32, "
      "int64 or uint8, got ", a.scalar_type());
  at::Tensor out = at::empty_like(a, at::MemoryFormat::Contiguous);
  at::Tensor ac = a.contiguous();
  at::Tensor bc = b.contiguous();
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "my_add_cpu", [&] {
    const scalar_t* pa = ac.data_ptr<scalar_t>();
    const scalar_t* pb = bc.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      po[i] = static_cast<scalar_t>(2) * pa[i] + pb[i];
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(onnx_custom_ext, m) {
  // The fake (meta) kernel and autograd formula live in Python; torch requires this pointer.
  m.set_python_module("onnx_custom.ops.extension");
  m.def("my_add(Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(onnx_custom_ext, CPU, m) {
  m.impl("my_add", &my_add_cpu);
}
