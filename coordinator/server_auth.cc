#include "coordinator/server_auth.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace substrax {

// One per call: decides at POST_RECV_INITIAL_METADATA (the metadata and the connection's auth
// context are known, the handler has not run), forgets when the call is gone.
class CallAuthorizer::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(CallAuthorizer* owner, grpc::experimental::ServerRpcInfo* info)
      : owner_(owner), info_(info) {}
  ~Interceptor() override {
    if (serial_ != 0) owner_->Forget(info_->server_context(), serial_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      PeerCredentials peer;
      const grpc::ServerContextBase* context = info_->server_context();
      if (std::shared_ptr<const grpc::AuthContext> auth = context->auth_context()) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
          peer.common_name.assign(v.data(), v.size());
        }
        for (const grpc::string_ref& v :
             auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
          peer.subject.assign(v.data(), v.size());
        }
      }
      if (auto* metadata = methods->GetRecvInitialMetadata()) {
        auto header = metadata->find("authorization");
        if (header != metadata->end()) {
          peer.authorization.emplace(header->second.data(), header->second.size());
        }
      }
      serial_ = owner_->Record(context, owner_->auth_->Authorize(peer, info_->method()));
    }
    methods->Proceed();
  }

 private:
  CallAuthorizer* const owner_;
  grpc::experimental::ServerRpcInfo* const info_;
  // What Record returned; 0 until then.
  uint64_t serial_ = 0;
};

class CallAuthorizer::Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(CallAuthorizer* owner) : owner_(owner) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Interceptor(owner_, info);
  }

 private:
  CallAuthorizer* const owner_;
};

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallAuthorizer::MakeInterceptorFactory() {
  return std::make_unique<Factory>(this);
}

absl::StatusOr<Caller> CallAuthorizer::Decision(const grpc::ServerContextBase* context) const {
  absl::MutexLock lock(&mu_);
  auto it = decisions_.find(context);
  if (it == decisions_.end()) {
    return absl::PermissionDeniedError(
        "this call was not authorized (no decision recorded for it); refused");
  }
  return it->second.decision;
}

size_t CallAuthorizer::calls() const {
  absl::MutexLock lock(&mu_);
  return decisions_.size();
}

uint64_t CallAuthorizer::Record(const grpc::ServerContextBase* context,
                                absl::StatusOr<Caller> decision) {
  absl::MutexLock lock(&mu_);
  const uint64_t serial = ++last_serial_;
  decisions_.insert_or_assign(context, Entry{serial, std::move(decision)});
  return serial;
}

void CallAuthorizer::Forget(const grpc::ServerContextBase* context, uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = decisions_.find(context);
  // A context's address is reused: an async call's context may be freed, and the next call's
  // decision recorded at the same address, before the old call's interceptor goes.
  if (it != decisions_.end() && it->second.serial == serial) decisions_.erase(it);
}

}  // namespace substrax
