// store_outsider: an outsider that tries to restart a running job through its rendezvous store
// by writing the failure record hsgd-run's agents watch ("hsgd-run/attempt/0/failed"; a
// restartable record there makes every agent stop its workers and start them again).
//
//   store_outsider HOST PORT JOB wrong-token   # TLS, keyed by a random token (not the job's)
//   store_outsider HOST PORT JOB no-token      # plain TCP, as a client of an --insecure server
//
// It prints one line and exits: 0 "refused: ..." when the server refused the connection (what a
// job's server must do), 1 "WROTE ..." when the record was written (the job is open to anyone),
// 3 "no answer: ..." when the server never answered, 2 on a usage error.

#include <openssl/rand.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "comm/error.h"
#include "comm/launcher/failure_record.h"
#include "comm/rendezvous/tcp_store.h"

int main(int argc, char** argv) {
  const std::string usage = "usage: store_outsider HOST PORT JOB wrong-token|no-token";
  if (argc != 5) {
    std::fprintf(stderr, "%s\n", usage.c_str());
    return 2;
  }
  const std::string mode = argv[4];
  if (mode != "wrong-token" && mode != "no-token") {
    std::fprintf(stderr, "store_outsider: mode '%s' is not wrong-token or no-token\n%s\n",
                 mode.c_str(), usage.c_str());
    return 2;
  }
  hsgd::comm::TcpStoreOptions options{.host = argv[1],
                                      .port = std::stoi(argv[2]),
                                      .job_id = argv[3],
                                      .connect_timeout = std::chrono::seconds(10),
                                      .republish = false};
  if (mode == "no-token") {
    options.insecure = true;
  } else {
    // 64 hex digits, as a token file holds: the right form, the wrong secret.
    unsigned char raw[32];
    RAND_bytes(raw, sizeof raw);
    for (unsigned char b : raw) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", b);
      options.token += hex;
    }
  }
  const std::string key = "hsgd-run/attempt/0/failed";
  const hsgd::comm::launcher::FailureRecord record{
      .node_rank = 1, .rank = 1, .message = "rank 1 exited with code 1 (an outsider's record)"};
  try {
    hsgd::comm::TcpStore store(options);
    store.compare_set(key, {}, hsgd::comm::to_bytes(record.encode()));
    std::printf("WROTE %s through %s (%s)\n", key.c_str(), store.endpoint().c_str(), mode.c_str());
    return 1;
  } catch (const hsgd::Timeout& e) {
    std::printf("no answer (%s): %s\n", mode.c_str(), e.what());
    return 3;
  } catch (const hsgd::Error& e) {
    std::printf("refused (%s): %s\n", mode.c_str(), e.what());
    return 0;
  }
}
