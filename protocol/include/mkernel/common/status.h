// status.h: the result of every host call in the daemon and the runtime.
//
// A Status is a code from a small grouped set plus a message written for the person who reads
// the log: what was wrong, with the field, the value and what was expected. Functions return
// it; nothing in library code exits or aborts.
//
// Where an error comes from travels with it:
//  - the origin: the constructor's last parameter is a source location defaulted to the
//    caller's, so every `Status(code, message)` records the file and line that made it (no call
//    site has to say so; errno_status does the same for its caller). SourceLocation is
//    std::source_location where the standard library has it, and the same two facts from
//    __builtin_FILE / __builtin_LINE where it does not (clang before 15 with libstdc++);
//  - the trail: MK_RETURN_IF_ERROR and MK_ASSIGN_OR_RETURN add the line that passed the error
//    up, so the way back to the caller reads like a short stack;
//  - with_context() keeps both (the error is still the one made at the origin).
// message() is the text alone (what clients and peers are sent); to_string() adds the code name
// in front and the places behind, for logs and operators:
//   "invalid argument: capacity_log2: 25; expected 1..20 (at session.cc:31 via daemon.cc:610)"
// File names are shown without their directories.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <version>
#if defined(__cpp_lib_source_location)
#include <source_location>
#endif

namespace mkernel {

#if defined(__cpp_lib_source_location)
using SourceLocation = std::source_location;
#else
// What std::source_location offers, from builtins GCC, clang and nvcc all have. The defaults are
// evaluated where current() is called, so current() in a default argument names the caller.
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          uint32_t line = __builtin_LINE()) noexcept {
    SourceLocation here;
    here.file_ = file;
    here.line_ = line;
    return here;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr uint32_t line() const noexcept { return line_; }

 private:
  const char* file_ = "";
  uint32_t line_ = 0;
};
#endif

enum class StatusCode : int {
  kOk = 0,
  // Caller errors.
  kInvalidArgument = 1,   // a value outside its contract
  kNotFound = 2,          // a named thing (region, ring, client, GPU) does not exist
  kAlreadyExists = 3,
  kPermissionDenied = 4,  // peer credentials, tokens
  kResourceExhausted = 5, // a quota or a limit
  kFailedPrecondition = 6,// the call is valid but not in this state (draining, closed)
  // Environment errors.
  kUnavailable = 7,       // a peer or the daemon cannot be reached; may succeed later
  kDeadlineExceeded = 8,  // a bounded wait expired
  kIoError = 9,           // a system call failed; the message carries errno's text
  kProtocolError = 10,    // a peer sent something malformed
  kDeviceError = 11,      // CUDA, NIC
  kInternal = 12,         // a broken invariant of ours
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, SourceLocation where = SourceLocation::current())
      : code_(code),
        message_(std::move(message)),
        file_(code == StatusCode::kOk ? nullptr : where.file_name()),
        line_(code == StatusCode::kOk ? 0 : where.line()) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The origin: the file (without directories) and line that made this error; "" and 0 for ok.
  std::string_view file() const;
  uint32_t line() const { return line_; }
  // "session.cc:31 via daemon.cc:610": the origin, then every line that passed it up; "" for ok.
  std::string where() const;
  // "invalid argument: capacity_log2: 25; expected 1..20 (at session.cc:31 via daemon.cc:610)";
  // "ok" for ok.
  std::string to_string() const;
  // Prepends context ("session 3: " + message); keeps the origin and the trail.
  Status with_context(std::string_view context) const;
  // Adds `site` to the trail (the macros below call it as the error travels up).
  Status passed_through(SourceLocation site) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  const char* file_ = nullptr;  // SourceLocation's file name: static storage
  uint32_t line_ = 0;
  std::string trail_;           // " via file:line" per site, oldest first
};

// Builds a Status from errno: "<what>: <strerror(err)>", made at the caller's line.
Status errno_status(std::string_view what, int err, SourceLocation where = SourceLocation::current());

// A value or the Status saying why there is none.
template <class T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)), has_(true) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {       // NOLINT
    if (status_.ok()) static_cast<void>(status_ = Status(StatusCode::kInternal, "StatusOr built from an ok Status"));
  }
  bool ok() const { return has_; }
  const Status& status() const { return status_; }
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }

 private:
  T value_{};
  Status status_;
  bool has_ = false;
};

}  // namespace mkernel

#define MK_STATUS_CONCAT_INNER(a, b) a##b
#define MK_STATUS_CONCAT(a, b) MK_STATUS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is not ok, with this line
// added to its trail.
#define MK_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                             \
    ::mkernel::Status mk_status_ = (expr);                                         \
    if (!mk_status_.ok()) return mk_status_.passed_through(::mkernel::SourceLocation::current()); \
  } while (0)

// Assigns the value of a StatusOr expression to `lhs` or returns its Status (this line added to
// its trail).
#define MK_ASSIGN_OR_RETURN(lhs, expr)                                           \
  auto MK_STATUS_CONCAT(mk_sor_, __LINE__) = (expr);                             \
  if (!MK_STATUS_CONCAT(mk_sor_, __LINE__).ok())                                 \
    return MK_STATUS_CONCAT(mk_sor_, __LINE__).status().passed_through(::mkernel::SourceLocation::current()); \
  lhs = std::move(MK_STATUS_CONCAT(mk_sor_, __LINE__)).value()
