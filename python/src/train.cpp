// Placeholder: filled in by the train bindings.
#include "bindings.h"

namespace microllm::python {

void bind_train(py::module_& /*m*/) {}

}  // namespace microllm::python
