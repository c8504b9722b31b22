#include "microllm/backend/kernel_params.h"

namespace microllm {

const char* unary_op_name(UnaryOp op) {
  switch (op) {
#define MICROLLM_NAME_CASE(name) \
  case UnaryOp::name:            \
    return #name;
    MICROLLM_UNARY_OPS(MICROLLM_NAME_CASE)
#undef MICROLLM_NAME_CASE
  }
  return "?";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
#define MICROLLM_NAME_CASE(name) \
  case BinaryOp::name:           \
    return #name;
    MICROLLM_BINARY_OPS(MICROLLM_NAME_CASE)
#undef MICROLLM_NAME_CASE
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
#define MICROLLM_NAME_CASE(name) \
  case ReduceOp::name:           \
    return #name;
    MICROLLM_REDUCE_OPS(MICROLLM_NAME_CASE)
#undef MICROLLM_NAME_CASE
  }
  return "?";
}

}  // namespace microllm
