// Registers the native ops of vllm._C with the torch dispatcher and gives Python a module to import.

#include <Python.h>
#include <torch/all.h>
#include <torch/library.h>

void dynamic_per_token_scaled_fp8_quant(torch::Tensor& out, const torch::Tensor& input,
                                        torch::Tensor& scales, double fp8_max);

// A tensor over `input`'s memory that does not own it: CUDA-graph replay keeps buffers alive
// through the graph's memory pool, so captured arguments need not hold references.
torch::Tensor weak_ref_tensor(const torch::Tensor& input) {
  return torch::from_blob(input.data_ptr(), input.sizes(), input.strides(), input.options());
}

TORCH_LIBRARY(_C, m) {
  m.def("weak_ref_tensor(Tensor input) -> Tensor");
  m.def(
      "dynamic_per_token_scaled_fp8_quant(Tensor! out, Tensor input, Tensor! scales, "
      "float fp8_max) -> ()");
}

TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  m.impl("dynamic_per_token_scaled_fp8_quant", &dynamic_per_token_scaled_fp8_quant);
  m.impl("weak_ref_tensor", &weak_ref_tensor);
}

// `import vllm._C` loads this library, which runs the registrations above.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "vllm-k3 native ops", -1, nullptr};
  return PyModule_Create(&module);
}
