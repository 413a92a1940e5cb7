#pragma once
// Errors are values: every public entry point returns a Status. Nothing in m3sa exits, aborts or
// throws across its API.
#include <string>
#include <utility>

namespace m3sa {

enum class StatusCode {
  ok = 0,
  invalid_argument, // the caller passed something outside the documented range or shape
  unsupported,      // valid, but this backend / build / device cannot run it
  cuda_error,       // a CUDA runtime call failed
  internal,         // a bug in m3sa
};

const char* to_string(StatusCode code);

class [[nodiscard]] Status {
public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  // "<argument>: expected <expectation>, got <received>" keeps every message greppable and
  // actionable.
  static Status invalid_argument(const std::string& argument, const std::string& expectation,
                                 const std::string& received);
  static Status unsupported(const std::string& what, const std::string& reason);

  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

} // namespace m3sa
