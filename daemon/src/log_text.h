// log_text.h: client-supplied text made safe to log and to print on an operator's terminal.
//
// Client names, communicator ids, Connect's root, handle keys and the names of descriptors a
// client hands over are whatever the client wrote: a newline would forge a log line, a
// terminal escape would rewrite the operator's screen, a NUL would cut a line short in some
// readers. printable() makes such text plain ASCII: printable characters stay, `\` and `"` are
// escaped, `\n`, `\r` and `\t` are written as such and every other byte (control characters, DEL
// and everything >= 0x80) as `\xNN`. The result never contains a byte below 0x20 or above 0x7e,
// so it is safe in the text log, inside the JSON log's escaped message, and in mkerneldctl's
// tables. Long text is cut (the length is kept in the message), so a client cannot make one log
// line huge. Header-only: mkerneldctl uses it too.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mkernel::daemon {

inline constexpr size_t kMaxLoggedTextBytes = 256;

inline std::string printable(std::string_view text, size_t max_bytes = kMaxLoggedTextBytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() < max_bytes ? text.size() + 8 : max_bytes + 32);
  const size_t shown = text.size() < max_bytes ? text.size() : max_bytes;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c > 0x7e) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  if (shown < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

// printable(text) in double quotes, the way log lines show client-supplied names.
inline std::string quoted_printable(std::string_view text) { return "\"" + printable(text) + "\""; }

}  // namespace mkernel::daemon
