#pragma once
// GlooStore: makes any hsgd Store usable by Gloo's rendezvous (gloo::rendezvous::Context::
// connectFullMesh), under a key prefix, with a deadline on every blocking call. Gloo's own
// wait(keys) without a timeout uses the adapter's timeout, so Gloo can never block forever.
// Errors are hsgd errors (hsgd::Timeout names the prefixed keys), thrown through Gloo.
//
// Usage:
//   auto adapter = hsgd::comm::as_gloo_store(store, "job/pg0/", std::chrono::seconds(30));
//   // context->connectFullMesh(*adapter, device);   // a gloo::rendezvous::Context

#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>

#include "comm/store/store.h"

namespace hsgd::comm {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<comm::Store> store, std::string prefix, Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // Constant after construction.
  const std::shared_ptr<comm::Store> store_;
  const std::string prefix_;
  const Duration timeout_;
};

// Returns a GlooStore over store; keys are prefix + Gloo's key.
std::unique_ptr<GlooStore> as_gloo_store(std::shared_ptr<Store> store, std::string prefix,
                                         Duration timeout = kDefaultTimeout);

}  // namespace hsgd::comm
