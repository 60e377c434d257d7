// The Python module of the engine's C++ code (autotune.engine.native builds and loads it).
#include <torch/extension.h>

namespace autotune {
torch::Tensor small_linear(torch::Tensor x, torch::Tensor w);
std::vector<torch::Tensor> huge_page_copies(const std::vector<torch::Tensor>& tensors);
void bind_decoder(pybind11::module& m);
}  // namespace autotune

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &autotune::small_linear, "x @ w.T for a few rows of x (float32)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("huge_page_copies", &autotune::huge_page_copies,
        "copies of contiguous CPU tensors in one block of 2 MiB pages");
  autotune::bind_decoder(m);
}
