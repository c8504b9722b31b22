// Placeholder: filled in by the ops bindings.
#include "bindings.h"

namespace microllm::python {

void bind_ops(py::module_& /*m*/) {}

}  // namespace microllm::python
