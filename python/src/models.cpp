// Placeholder: filled in by the models bindings.
#include "bindings.h"

namespace microllm::python {

void bind_models(py::module_& /*m*/) {}

}  // namespace microllm::python
