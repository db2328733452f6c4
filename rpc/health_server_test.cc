#include "rpc/health_server.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

grpc::health::v1::HealthCheckResponse::ServingStatus Check(int port, const std::string& service,
                                                           grpc::StatusCode* code) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  *code = stub->Check(&context, request, &response).error_code();
  return response.status();
}

TEST(HealthServerTest, ServesStatusesPerService) {
  auto server = HealthServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::StatusCode code;
  EXPECT_EQ(Check((*server)->port(), "", &code), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(code, grpc::StatusCode::OK);
  Check((*server)->port(), "substrax.worker.ready", &code);
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
  (*server)->SetServing("substrax.worker.ready", false);
  EXPECT_EQ(Check((*server)->port(), "substrax.worker.ready", &code),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  (*server)->SetServing("substrax.worker.ready", true);
  EXPECT_EQ(Check((*server)->port(), "substrax.worker.ready", &code),
            grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(HealthServerTest, BusyAddressIsUnavailable) {
  auto first = HealthServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  auto second = HealthServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace substrax
