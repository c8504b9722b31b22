// Errors: one hierarchy, every message names the operation and the offending values.
//   [rms_norm] weight shape [512] does not match the last dim of input [2, 7, 896]
// The library throws; the C API (capi/) catches at every entry point and returns status codes; the server turns
// exceptions into OpenAI error objects.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace microllm {

// Concatenates anything with an operator<< into one string (g++ 12 has no std::format).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

class Error : public std::runtime_error {
 public:
  // `where` is the op, file or subsystem ("rms_norm", "model.safetensors"); it prefixes the message.
  Error(const std::string& where, const std::string& what)
      : std::runtime_error(where.empty() ? what : "[" + where + "] " + what), where_(where) {}
  const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
};

// Argument checks of ops: wrong shapes, dtypes, devices, values.
class ShapeError : public Error { using Error::Error; };
class DTypeError : public Error { using Error::Error; };
class DeviceError : public Error { using Error::Error; };
class ValueError : public Error { using Error::Error; };
class IndexError : public Error { using Error::Error; };
// A kernel or feature that this build or backend does not provide ("rms_norm has no CUDA kernel for f16").
class NotSupportedError : public Error { using Error::Error; };
// Files and parsing: the message names the file and the offset or field.
class IoError : public Error { using Error::Error; };
class ParseError : public Error { using Error::Error; };
// Failures reported by CUDA, cuBLASLt, NCCL, MPI: the message names the call and file:line.
class BackendError : public Error { using Error::Error; };
class OutOfMemoryError : public Error { using Error::Error; };

}  // namespace microllm

// Throws `ErrorType(where, message)` unless `cond` holds. The message is built only on failure.
#define MICROLLM_CHECK(cond, ErrorType, where, ...)                 \
  do {                                                              \
    if (!(cond)) throw ErrorType((where), ::microllm::str_cat(__VA_ARGS__)); \
  } while (0)
