#include "coordinator/server_auth.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
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
    if (counted_) owner_->Release(name_, stream_);
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
      stream_ = info_->type() != grpc::experimental::ServerRpcInfo::Type::UNARY;
      absl::StatusOr<Caller> decision = owner_->Admit(
          owner_->auth_->Authorize(peer, info_->method()), stream_, info_->method(), &counted_);
      if (counted_) name_ = decision->name;
      serial_ = owner_->Record(context, std::move(decision));
    }
    methods->Proceed();
  }

 private:
  CallAuthorizer* const owner_;
  grpc::experimental::ServerRpcInfo* const info_;
  // What Record returned; 0 until then.
  uint64_t serial_ = 0;
  // Counted against name_'s caps (Admit), as a stream or a unary call.
  bool counted_ = false;
  bool stream_ = false;
  std::string name_;
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

int CallAuthorizer::counted(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(name);
  return it == in_flight_.end() ? 0 : it->second.first + it->second.second;
}

absl::StatusOr<Caller> CallAuthorizer::Admit(absl::StatusOr<Caller> decision, bool stream,
                                             absl::string_view method, bool* counted) {
  *counted = false;
  // The worker-facing service is never capped (its calls are the cluster's own work), nor a
  // worker wherever it calls, nor --insecure's one anonymous caller.
  if (!decision.ok() || decision->unrestricted || decision->Has(Role::kWorker) ||
      absl::StrContains(method, "CoordinatorService/")) {
    return decision;
  }
  const int cap = stream ? caps_.max_streams_per_caller : caps_.max_calls_per_caller;
  absl::MutexLock lock(&mu_);
  auto& [streams, calls] = in_flight_[decision->name];
  int& count = stream ? streams : calls;
  if (cap > 0 && count >= cap) {
    if (streams == 0 && calls == 0) in_flight_.erase(decision->name);
    return absl::ResourceExhaustedError(absl::StrCat(
        decision->Describe(), " already has ", count,
        stream ? " open streams (watch, logs -f), the cap per caller (--max-streams-per-caller="
               : " calls in flight, the cap per caller (--max-calls-per-caller=",
        cap, "); close some and retry, or ask the administrator to raise the cap"));
  }
  ++count;
  *counted = true;
  return decision;
}

void CallAuthorizer::Release(const std::string& name, bool stream) {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(name);
  if (it == in_flight_.end()) return;
  --(stream ? it->second.first : it->second.second);
  if (it->second.first <= 0 && it->second.second <= 0) in_flight_.erase(it);
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
