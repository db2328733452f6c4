// Defaults fill fields left unset. A zero the YAML wrote explicitly is not "unset": it stays, so
// that validation reports it instead of a default hiding it.
#include <string>

#include "core/job_spec.h"
#include "core/job_spec_internal.h"
#include "core/optimizers.h"

namespace substrax {
namespace job_spec_internal {
namespace {

class Defaults {
 public:
  explicit Defaults(const Positions* positions) : positions_(positions) {}

  void Apply(v1::JobSpec* spec) const {
    // Sections left out stay out, so that validation can say they are required.
    const v1::ModelSpec& model = spec->model();
    if (spec->has_model() && model.type() == v1::MODEL_TYPE_LINEAR &&
        Unset("spec.model.output_size", model.output_size())) {
      spec->mutable_model()->set_output_size(1);
    }
    if (spec->has_data()) Data(model, spec->mutable_data());
    if (spec->has_optimizer()) Optimizer(spec->mutable_optimizer());
    if (spec->has_mesh()) Mesh(spec->mutable_mesh());
    if (spec->has_batch()) Batch(spec);
    // A checkpointed job saves at its end unless told not to: a job that succeeds leaves its
    // final state.
    if (spec->has_checkpoint() && !spec->checkpoint().has_at_end()) {
      spec->mutable_checkpoint()->set_at_end(true);
    }
    if (spec->metrics().empty() && !Written("spec.metrics")) {
      auto& metrics = *spec->mutable_metrics();
      metrics[kMetricLoss] = v1::REDUCTION_MEAN;
      metrics[kMetricStep] = v1::REDUCTION_MAX;
      if (IsClassification(model.type())) metrics[kMetricAccuracy] = v1::REDUCTION_MEAN;
    }
    if (Unset("spec.report_every_steps", spec->report_every_steps())) {
      spec->set_report_every_steps(50);
    }
    if (spec->has_command() && spec->command().processes() == v1::COMMAND_PROCESSES_UNSPECIFIED) {
      spec->mutable_command()->set_processes(v1::COMMAND_PROCESSES_PER_WORKER);
    }
    if (spec->backend() == v1::BACKEND_UNSPECIFIED) spec->set_backend(v1::BACKEND_AUTO);
    if (spec->precision() == v1::PRECISION_UNSPECIFIED) spec->set_precision(v1::PRECISION_FP32);
  }

 private:
  bool Written(const std::string& path) const {
    return positions_ != nullptr && positions_->Present(path);
  }
  bool Unset(const std::string& path, int64_t value) const { return value == 0 && !Written(path); }

  void Data(const v1::ModelSpec& model, v1::DataSpec* data) const {
    if (!data->has_shuffle()) data->set_shuffle(true);
    if (Unset("spec.data.prefetch_size", data->prefetch_size())) data->set_prefetch_size(2);
    if (data->format() == v1::DATA_FORMAT_CSV && data->csv().delimiter().empty() &&
        !Written("spec.data.csv.delimiter")) {
      data->mutable_csv()->set_delimiter(",");
    }
    if (data->format() == v1::DATA_FORMAT_SYNTHETIC &&
        Unset("spec.data.synthetic.num_outputs", data->synthetic().num_outputs())) {
      data->mutable_synthetic()->set_num_outputs(
          IsClassification(model.type()) ? model.num_classes() : model.output_size());
    }
  }

  // The table's defaults (optax's), written into the spec so that `substraxctl get` shows every
  // constant the job runs with.
  void Optimizer(v1::OptimizerSpec* opt) const {
    const OptimizerInfo* info = FindOptimizer(opt->type());
    if (info == nullptr) return;  // validation says why
    auto& hyper = *opt->mutable_hyperparameters();
    for (const HyperParameter& h : info->hyper) {
      if (hyper.find(h.name) == hyper.end()) hyper[h.name] = h.default_value;
    }
  }

  void Mesh(v1::MeshSpec* mesh) const {
    if (mesh->type() == v1::MESH_TYPE_UNSPECIFIED) {
      if (mesh->num_devices() != 0 || Written("spec.mesh.num_devices")) {
        mesh->set_type(v1::MESH_TYPE_MODEL_PARALLEL);
      } else if (mesh->model_parallel_size() > 1) {
        mesh->set_type(v1::MESH_TYPE_HYBRID);
      } else {
        mesh->set_type(v1::MESH_TYPE_DATA_PARALLEL);
      }
    }
    const bool mp_unset = Unset("spec.mesh.model_parallel_size", mesh->model_parallel_size());
    if (mesh->type() == v1::MESH_TYPE_DATA_PARALLEL && mp_unset) {
      mesh->set_model_parallel_size(1);
    }
    if (mesh->type() == v1::MESH_TYPE_MODEL_PARALLEL) {
      if (Unset("spec.mesh.data_parallel_size", mesh->data_parallel_size())) {
        mesh->set_data_parallel_size(1);
      }
      if (mp_unset) mesh->set_model_parallel_size(mesh->num_devices());
    }
  }

  void Batch(v1::JobSpec* spec) const {
    v1::BatchSpec* batch = spec->mutable_batch();
    const int64_t dp = DataAxisSize(*spec);
    if (dp <= 0) return;
    if (Unset("spec.batch.global_batch_size", batch->global_batch_size()) &&
        batch->per_device_batch_size() > 0 && dp <= kMaxMeshAxisSize &&
        batch->per_device_batch_size() * dp <= kMaxBatchSize) {
      batch->set_global_batch_size(batch->per_device_batch_size() * dp);
    }
    if (Unset("spec.batch.per_device_batch_size", batch->per_device_batch_size()) &&
        batch->global_batch_size() > 0 && batch->global_batch_size() <= kMaxBatchSize &&
        batch->global_batch_size() % dp == 0) {
      batch->set_per_device_batch_size(batch->global_batch_size() / dp);
    }
  }

  const Positions* positions_;
};

}  // namespace

void ApplyDefaults(const Positions* positions, v1::JobSpec* spec) {
  Defaults(positions).Apply(spec);
}

}  // namespace job_spec_internal
}  // namespace substrax
