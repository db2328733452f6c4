// Checks on the wire contract itself: the conventions every rpc follows, and that the generated
// messages and stubs work end to end over a real gRPC channel.
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax {
namespace {

const char* const kServiceFiles[] = {
    "substrax/v1/coordinator_service.proto",
    "substrax/v1/job_service.proto",
    "substrax/v1/metrics_service.proto",
};

// A FooRequest/FooResponse pair for every rpc, even when empty.
TEST(ContractTest, EveryRpcHasItsOwnRequestAndResponse) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  int methods = 0;
  for (const char* name : kServiceFiles) {
    const google::protobuf::FileDescriptor* file = pool->FindFileByName(name);
    ASSERT_NE(file, nullptr) << name;
    EXPECT_EQ(file->package(), "substrax.v1");
    ASSERT_GE(file->service_count(), 1) << name;
    for (int s = 0; s < file->service_count(); ++s) {
      const auto* service = file->service(s);
      for (int m = 0; m < service->method_count(); ++m) {
        const auto* method = service->method(m);
        EXPECT_EQ(method->input_type()->name(), method->name() + "Request") << method->full_name();
        EXPECT_EQ(method->output_type()->name(), method->name() + "Response")
            << method->full_name();
        ++methods;
      }
    }
  }
  EXPECT_GE(methods, 15);
}

// A comment on every rpc that names its possible errors.
TEST(ContractTest, EveryRpcDocumentsItsErrors) {
  const std::regex rpc_line(R"(^\s*rpc\s+(\w+)\s*\()");
  for (const char* name : kServiceFiles) {
    std::ifstream in(std::string("proto/") + name);
    ASSERT_TRUE(in) << name;
    std::string line, comment;
    int rpcs = 0;
    while (std::getline(in, line)) {
      std::smatch match;
      if (std::regex_search(line, match, rpc_line)) {
        ++rpcs;
        EXPECT_NE(comment.find("Errors:"), std::string::npos)
            << name << ": rpc " << match[1] << " has no 'Errors:' in its comment";
        comment.clear();
      } else if (line.find("//") != std::string::npos) {
        comment += line;
      } else {
        comment.clear();
      }
    }
    EXPECT_GT(rpcs, 0) << name;
  }
}

class FakeJobService final : public v1::JobService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override {
    if (request->job_id() != "mlp-1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job " + request->job_id());
    }
    v1::Job* job = response->mutable_job();
    job->set_id("mlp-1");
    job->set_state(v1::JOB_STATE_RUNNING);
    job->mutable_spec()->set_name("mlp");
    job->mutable_spec()->set_steps(100);
    (*job->mutable_spec()->mutable_metrics())["loss"] = v1::REDUCTION_MEAN;
    v1::Device* device = job->mutable_mesh()->add_devices();
    device->set_host("host-a");
    device->set_kind(v1::DEVICE_KIND_CUDA);
    return grpc::Status::OK;
  }
};

TEST(ContractTest, StubsTalkToAServerOverARealChannel) {
  FakeJobService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = v1::JobService::NewStub(channel);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest request;
    request.set_job_id("mlp-1");
    v1::GetJobResponse response;
    grpc::Status status = stub->GetJob(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.job().state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(response.job().spec().steps(), 100);
    EXPECT_EQ(response.job().spec().metrics().at("loss"), v1::REDUCTION_MEAN);
    EXPECT_EQ(response.job().mesh().devices(0).kind(), v1::DEVICE_KIND_CUDA);
  }
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest request;
    request.set_job_id("nope");
    v1::GetJobResponse response;
    grpc::Status status = stub->GetJob(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(status.error_message(), "no job nope");
  }
  {
    // An rpc the server does not implement is UNIMPLEMENTED, never a silent empty answer.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CancelJobResponse response;
    grpc::Status status = stub->CancelJob(&context, v1::CancelJobRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  // The other services' stubs build against the same channel.
  EXPECT_NE(v1::CoordinatorService::NewStub(channel), nullptr);
  EXPECT_NE(v1::MetricsService::NewStub(channel), nullptr);
  server->Shutdown();
}

TEST(ContractTest, JobSpecSurvivesTheWire) {
  v1::JobSpec spec;
  spec.set_name("fashion-mnist-mlp");
  spec.mutable_model()->set_type(v1::MODEL_TYPE_MLP);
  spec.mutable_model()->add_hidden_sizes(512);
  // A hyper-parameter set to zero stays in the map: it is not "unset".
  (*spec.mutable_optimizer()->mutable_hyperparameters())["b1"] = 0.0;
  spec.mutable_mesh()->set_type(v1::MESH_TYPE_HYBRID);
  spec.set_epochs(3);
  spec.set_seed(~uint64_t{0});
  v1::JobSpec back;
  ASSERT_TRUE(back.ParseFromString(spec.SerializeAsString()));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, back));
  EXPECT_EQ(back.optimizer().hyperparameters().count("b1"), 1u);
  EXPECT_EQ(back.length_case(), v1::JobSpec::kEpochs);
}

}  // namespace
}  // namespace substrax
