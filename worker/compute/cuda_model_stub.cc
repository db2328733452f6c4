// CudaModel, CudaOptimizer and CudaMetrics in a build without --config=cuda: every factory fails
// with UNIMPLEMENTED (after checking what it can check without a GPU), so no object of these
// classes can exist; the other members are defined so that callers link in both builds.
#include <memory>
#include <utility>
#include <vector>

#include "core/optimizers.h"
#include "core/status.h"
#include "worker/compute/cuda_model.h"

namespace substrax {
namespace {
absl::Status NotBuilt() { return CudaNotBuilt(); }
}  // namespace

absl::StatusOr<std::unique_ptr<CudaMetrics>> CudaMetrics::Create(const CudaDevice&) {
  return NotBuilt();
}
CudaMetrics::~CudaMetrics() = default;
absl::Status CudaMetrics::Reset() { return NotBuilt(); }
absl::StatusOr<EvalResult> CudaMetrics::Read() { return NotBuilt(); }

struct CudaModel::Impl {};
CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;
absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const v1::ModelSpec&, int64_t,
                                                             const CudaDevice*,
                                                             CudaTensorParallelism) {
  return NotBuilt();
}
absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const v1::ModelSpec&, int64_t,
                                                             const CudaDevice*,
                                                             CudaTensorParallelism,
                                                             const CudaModelOptions&) {
  return NotBuilt();
}
int64_t CudaModel::graph_replays() const { return 0; }
const std::string& CudaModel::graph_fallback() const {
  static const std::string kNone;
  return kNone;
}
bool CudaModel::is_classification() const { return false; }
const std::vector<ParamSpec>& CudaModel::params() const {
  static const std::vector<ParamSpec> kNone;
  return kNone;
}
std::vector<int64_t> CudaModel::LocalShape(const ParamSpec& p) const { return p.shape; }
absl::StatusOr<DeviceTree> CudaModel::Init(uint64_t) const { return NotBuilt(); }
absl::Status CudaModel::LossAndGradients(const DeviceTree&, const DeviceBatchView&, DeviceTree*,
                                         CudaMetrics*) {
  return NotBuilt();
}
absl::Status CudaModel::Evaluate(const DeviceTree&, const DeviceBatchView&, CudaMetrics*) {
  return NotBuilt();
}

struct CudaOptimizer::Impl {};
CudaOptimizer::CudaOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaOptimizer::~CudaOptimizer() = default;
absl::StatusOr<std::unique_ptr<CudaOptimizer>> CudaOptimizer::Create(
    const v1::OptimizerSpec& spec, const CudaDevice* device) {
  // A bad spec is the caller's error in either build; say so before "not built".
  SUBSTRAX_ASSIGN_OR_RETURN(OptimizerConfig config, ResolveOptimizer(spec));
  return Create(config, device);
}
absl::StatusOr<std::unique_ptr<CudaOptimizer>> CudaOptimizer::Create(const OptimizerConfig&,
                                                                     const CudaDevice*) {
  return NotBuilt();
}
absl::Status CudaOptimizer::Update(const DeviceTree&, DeviceTree*) { return NotBuilt(); }
void CudaOptimizer::EnableCudaGraphs() {}
int64_t CudaOptimizer::graph_replays() const { return 0; }
const std::string& CudaOptimizer::graph_fallback() const {
  static const std::string kNone;
  return kNone;
}
absl::Status CudaOptimizer::ScaleGradients(DeviceTree*, float) { return NotBuilt(); }
int64_t CudaOptimizer::steps() const { return 0; }

}  // namespace substrax
