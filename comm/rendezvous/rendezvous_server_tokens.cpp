#include "comm/rendezvous/rendezvous_server_tokens.h"

#include <openssl/rand.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "comm/error.h"

namespace hsgd::comm {
namespace {

// Printable ASCII without space: what may appear in a job id or a token.
bool is_visible(unsigned char c) { return c > 0x20 && c < 0x7f; }

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_blank(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !is_blank(line[i])) ++i;
    if (i > start) fields.push_back(line.substr(start, i - start));
  }
  return fields;
}

std::optional<std::string> token_problem(std::string_view token) {
  if (token.size() > kMaxTokenBytes) {
    return "a token of " + std::to_string(token.size()) + " bytes (at most " +
           std::to_string(kMaxTokenBytes) + ")";
  }
  for (const char c : token) {
    if (!is_visible(static_cast<unsigned char>(c))) {
      return "a token with the byte " + printable_excerpt(std::string_view(&c, 1)) +
             " (only printable ASCII without spaces)";
    }
  }
  return std::nullopt;
}

}  // namespace

std::string printable_excerpt(std::string_view text, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  if (text.size() > max_chars) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::optional<std::string> job_id_problem(std::string_view job) {
  if (job.empty()) return std::string("the job id is empty");
  if (job.size() > kMaxJobIdBytes) {
    return "the job id '" + printable_excerpt(job, 32) + "' has " + std::to_string(job.size()) +
           " bytes; at most " + std::to_string(kMaxJobIdBytes) + " are allowed";
  }
  for (const char c : job) {
    if (!is_visible(static_cast<unsigned char>(c))) {
      return "the job id '" + printable_excerpt(job) +
             "' holds a byte that is not printable ASCII (spaces and control characters are "
             "not allowed)";
    }
  }
  return std::nullopt;
}

bool same_token(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool TokenTable::admits(const std::string& job, std::string_view token) const {
  if (empty()) return true;
  const auto it = job_tokens.find(job);
  const std::string& expected = it != job_tokens.end() ? it->second : server_token;
  return !expected.empty() && same_token(token, expected);
}

std::string TokenTable::token_for(const std::string& job, const std::string& origin) const {
  if (const auto it = job_tokens.find(job); it != job_tokens.end()) return it->second;
  if (!server_token.empty() || empty()) return server_token;
  HSGD_THROW(InvalidArgument, origin, " has no line for job '", printable_excerpt(job),
             "' and no server-wide token; add a line '", printable_excerpt(job), " TOKEN'");
}

TokenTable parse_token_file(std::string_view text, const std::string& origin) {
  TokenTable table;
  size_t line_number = 0;
  int server_token_line = 0;
  std::map<std::string, size_t> job_line;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    const auto fields = split_fields(line);
    if (fields.empty() || fields[0].front() == '#') continue;
    const std::string where = origin + ", line " + std::to_string(line_number);
    if (fields.size() > 2) {
      HSGD_THROW(InvalidArgument, where, ": expected 'TOKEN' or 'JOB_ID TOKEN', got ",
                 fields.size(), " fields");
    }
    const std::string_view token = fields.back();
    if (auto problem = token_problem(token)) {
      HSGD_THROW(InvalidArgument, where, ": ", *problem);
    }
    if (fields.size() == 1) {
      if (server_token_line != 0) {
        HSGD_THROW(InvalidArgument, where, ": a second server-wide token (the first is on line ",
                   server_token_line, "); per-job lines read 'JOB_ID TOKEN'");
      }
      server_token_line = static_cast<int>(line_number);
      table.server_token = std::string(token);
      continue;
    }
    const std::string job(fields[0]);
    if (auto problem = job_id_problem(job)) HSGD_THROW(InvalidArgument, where, ": ", *problem);
    if (const auto it = job_line.find(job); it != job_line.end()) {
      HSGD_THROW(InvalidArgument, where, ": job '", job, "' is listed twice (also on line ",
                 it->second, ")");
    }
    job_line[job] = line_number;
    table.job_tokens[job] = std::string(token);
  }
  if (table.empty()) {
    HSGD_THROW(InvalidArgument, origin, " holds no token (only blank or comment lines)");
  }
  return table;
}

TokenTable read_token_file(const std::string& path, const std::string& origin) {
  const std::string name = origin.empty() ? "token file '" + path + "'" : origin;
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) HSGD_THROW(InvalidArgument, "cannot read ", name);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_token_file(text.str(), name);
}

std::string random_token() {
  std::array<unsigned char, 32> bytes{};
  HSGD_CHECK_AS(CommError, RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) == 1,
                "random_token: OpenSSL's RAND_bytes failed to make 32 random bytes");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (const unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace hsgd::comm
