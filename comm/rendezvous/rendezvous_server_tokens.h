#pragma once
// Who may open which job of a RendezvousServer: the job-id rule, the token table, and the one
// reader of --token-file that hsgd-rendezvous and hsgd-run share (so that one file means the
// same tokens to both).
//
// Token file format:
// - One entry per line. Spaces, tabs and a trailing '\r' around fields are ignored; blank lines
//   and lines whose first non-blank character is '#' are comments.
// - `TOKEN` alone: the server-wide token, for every job without its own line (at most one). A file
//   holding just a token (`echo secret > f`) is therefore what it always was.
// - `JOB_ID TOKEN`: the token of that job only. A client holding it cannot open any other job.
// - A token is 1 to 1024 printable ASCII characters without spaces; a job id follows
//   job_id_problem(). Anything else (three fields, a second server-wide token, a job listed
//   twice, no entry at all) is an hsgd::InvalidArgument naming the file and the line.
// - The token of job J is J's own line if the file has one, else the server-wide token: it keys
//   J's TLS connections (a key derives from one token), so a job with its own line is opened by
//   that token only, and the server-wide token opens the jobs without one. A client (hsgd-run)
//   presents the same: J's token if the file has one, else the server-wide token.
//
// Usage:
//   auto table = hsgd::comm::read_token_file("/etc/hsgd/tokens");
//   hsgd::comm::RendezvousServerOptions server_options;
//   server_options.token = table.server_token;
//   server_options.job_tokens = table.job_tokens;
//   hsgd::comm::TcpStoreOptions store_options;
//   store_options.token = table.token_for("job42");

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace hsgd::comm {

inline constexpr size_t kMaxJobIdBytes = 256;
inline constexpr size_t kMaxTokenBytes = 1024;

// Why job is not a valid job id (empty, longer than kMaxJobIdBytes, or a byte outside printable
// ASCII without space), or std::nullopt when it is valid. The text shows at most a short,
// printable excerpt of the id, so that it can be logged.
std::optional<std::string> job_id_problem(std::string_view job);

// A short printable rendering of untrusted text for messages and logs: at most max_chars
// characters, non-printable bytes as \xNN, and "... (N bytes)" when shortened.
std::string printable_excerpt(std::string_view text, size_t max_chars = 64);

// Compares without an early exit, so that timing does not reveal a matching prefix.
bool same_token(std::string_view a, std::string_view b);

struct TokenTable {
  std::string server_token = {};                  // empty: none
  std::map<std::string, std::string> job_tokens;  // job id -> token

  // True when no token is configured (the server admits everybody).
  bool empty() const { return server_token.empty() && job_tokens.empty(); }
  // Whether token is the one that keys job (job's own, else the server-wide one).
  bool admits(const std::string& job, std::string_view token) const;
  // The token a client of job presents; throws hsgd::InvalidArgument naming the job when the
  // table has neither an entry for it nor a server-wide token. "" for an empty table.
  std::string token_for(const std::string& job, const std::string& origin = "the token file") const;
};

// A fresh token for one job: 32 bytes from OpenSSL's RAND_bytes as 64 hex digits. Throws
// hsgd::CommError when the generator fails (it never returns a weak token).
std::string random_token();

// Parses the text of a token file; origin names it in errors ("--token-file '/x'").
TokenTable parse_token_file(std::string_view text, const std::string& origin);

// Reads and parses path; hsgd::InvalidArgument if it cannot be read or is malformed. origin names
// the file in errors; empty: "token file '<path>'".
TokenTable read_token_file(const std::string& path, const std::string& origin = {});

}  // namespace hsgd::comm
