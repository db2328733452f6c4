// The scheduling configuration: YAML -> v1::SchedulingConfig (read through the
// descriptors like a job spec, core/yaml_message.h), its defaults and its
// validation; and admission at submit, which only needs the configuration.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/scheduler.h"
#include "core/data_paths.h"
#include "core/yaml_message.h"

namespace substrax {
namespace scheduling {
namespace {

using yaml_message::Errors;
using yaml_message::Positions;

// Bounds on the file, so that a configuration cannot make every pass slow.
constexpr int kMaxQueues = 1000;
constexpr int kMaxPriorityClasses = 1000;
constexpr int kMaxQuotasPerQueue = 64;
constexpr int kMaxSubmittersPerQueue = 1000;

constexpr const char* kDefaultName = "default";
constexpr int64_t kDefaultWindowSeconds = 3600;
constexpr int64_t kDefaultGraceSeconds = 30;

// "a, b, c" of at most 20 names, for errors that list what exists.
template <typename List>
std::string Names(const List& list) {
  std::vector<std::string> names;
  for (const auto& item : list) {
    if (names.size() == 20) {
      names.push_back("...");
      break;
    }
    names.push_back(item.name());
  }
  return absl::StrJoin(names, ", ");
}

void CheckLabel(const std::string& name, const std::string& path, Errors* errors) {
  if (!IsDns1123Label(name)) {
    errors->Add(path, absl::StrCat("'", name,
                                   "' is not a DNS-1123 label (lowercase letters, digits and '-', "
                                   "starting and ending with a letter or digit, at most ",
                                   kMaxDnsLabelLength, " characters)"));
  }
}

void ApplyDefaults(const Positions& positions, v1::SchedulingConfig* config) {
  if (config->policy() == v1::SCHEDULING_POLICY_UNSPECIFIED) {
    config->set_policy(v1::SCHEDULING_POLICY_QUEUES);
  }
  if (config->queues().empty()) config->add_queues()->set_name(kDefaultName);
  if (config->default_queue().empty()) config->set_default_queue(config->queues(0).name());
  if (config->default_priority_class().empty()) {
    const auto& classes = config->priority_classes();
    const bool has_default = std::any_of(classes.begin(), classes.end(),
                                         [](const auto& c) { return c.name() == kDefaultName; });
    if (!has_default) {
      v1::PriorityClass* c = config->add_priority_classes();
      c->set_name(kDefaultName);
      c->set_value(0);
    }
    config->set_default_priority_class(kDefaultName);
  }
  if (!positions.Present("fair_share_window_seconds")) {
    config->set_fair_share_window_seconds(kDefaultWindowSeconds);
  }
  if (!positions.Present("preemption_grace_seconds")) {
    config->set_preemption_grace_seconds(kDefaultGraceSeconds);
  }
}

void ValidateQueue(const v1::QueueConfig& queue, const std::string& path, Errors* errors) {
  CheckLabel(queue.name(), path + ".name", errors);
  if (!queue.cohort().empty()) CheckLabel(queue.cohort(), path + ".cohort", errors);
  if (queue.quotas_size() > kMaxQuotasPerQueue) {
    errors->Add(path + ".quotas", absl::StrCat("at most ", kMaxQuotasPerQueue,
                                               " quotas per queue, got ", queue.quotas_size()));
    return;
  }
  std::set<std::string> backends;
  for (int i = 0; i < queue.quotas_size(); ++i) {
    const v1::DeviceQuota& quota = queue.quotas(i);
    const std::string item = absl::StrCat(path, ".quotas[", i, "]");
    if (quota.backend() != "cpu" && quota.backend() != "cuda") {
      errors->Add(item + ".backend",
                  absl::StrCat("unknown backend '", quota.backend(), "'; use cpu or cuda"));
    } else if (!backends.insert(quota.backend()).second) {
      errors->Add(item + ".backend",
                  absl::StrCat("a second quota for ", quota.backend(), "; give one per backend"));
    }
    if (quota.devices() < 0) {
      errors->Add(item + ".devices", absl::StrCat("must be >= 0, got ", quota.devices()));
    }
    if (quota.has_borrowing_limit() && quota.borrowing_limit() < 0) {
      errors->Add(item + ".borrowing_limit",
                  absl::StrCat("must be >= 0, got ", quota.borrowing_limit()));
    }
  }
  const int submitters = queue.submitters().owners_size() + queue.submitters().roles_size();
  if (submitters > kMaxSubmittersPerQueue) {
    errors->Add(path + ".submitters",
                absl::StrCat("at most ", kMaxSubmittersPerQueue,
                             " owners and roles per queue, got ", submitters));
  }
}

void Validate(const v1::SchedulingConfig& config, Errors* errors) {
  if (config.queues_size() > kMaxQueues) {
    errors->Add("queues",
                absl::StrCat("at most ", kMaxQueues, " queues, got ", config.queues_size()));
  } else {
    std::set<std::string> names;
    for (int i = 0; i < config.queues_size(); ++i) {
      const std::string path = absl::StrCat("queues[", i, "]");
      ValidateQueue(config.queues(i), path, errors);
      if (!names.insert(config.queues(i).name()).second) {
        errors->Add(path + ".name",
                    absl::StrCat("queue '", config.queues(i).name(), "' is defined twice"));
      }
    }
    if (names.count(config.default_queue()) == 0) {
      errors->Add("default_queue", absl::StrCat("no queue is named '", config.default_queue(),
                                                "'; the queues are ", Names(config.queues())));
    }
  }
  if (config.priority_classes_size() > kMaxPriorityClasses) {
    errors->Add("priority_classes",
                absl::StrCat("at most ", kMaxPriorityClasses, " priority classes, got ",
                             config.priority_classes_size()));
  } else {
    std::set<std::string> names;
    for (int i = 0; i < config.priority_classes_size(); ++i) {
      const std::string path = absl::StrCat("priority_classes[", i, "].name");
      const std::string& name = config.priority_classes(i).name();
      CheckLabel(name, path, errors);
      if (!names.insert(name).second) {
        errors->Add(path, absl::StrCat("priority class '", name, "' is defined twice"));
      }
    }
    if (names.count(config.default_priority_class()) == 0) {
      errors->Add("default_priority_class",
                  absl::StrCat("no priority class is named '", config.default_priority_class(),
                               "'; the classes are ", Names(config.priority_classes())));
    }
  }
  if (config.fair_share_window_seconds() <= 0) {
    errors->Add("fair_share_window_seconds",
                absl::StrCat("must be > 0, got ", config.fair_share_window_seconds()));
  }
  if (config.preemption_grace_seconds() < 0) {
    errors->Add("preemption_grace_seconds",
                absl::StrCat("must be >= 0, got ", config.preemption_grace_seconds()));
  }
}

const v1::DeviceQuota* FindQuota(const v1::QueueConfig& queue, const std::string& pool) {
  for (const v1::DeviceQuota& quota : queue.quotas()) {
    if (quota.backend() == pool) return &quota;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<v1::SchedulingConfig> ParseSchedulingConfig(const std::string& yaml,
                                                           const std::string& source) {
  absl::StatusOr<YAML::Node> root =
      yaml_message::LoadDocument(yaml, source, "a scheduling configuration (queues: ...)");
  if (!root.ok()) return root.status();
  Errors errors;
  Positions positions;
  v1::SchedulingConfig config;
  yaml_message::ReadMessage(*root, "", &config, &errors, &positions);
  // Type errors leave fields unset; validating on top of them would only repeat
  // them.
  if (!errors.empty()) return yaml_message::ToStatus(errors, &positions, source);
  ApplyDefaults(positions, &config);
  Validate(config, &errors);
  if (!errors.empty()) return yaml_message::ToStatus(errors, &positions, source);
  return config;
}

v1::SchedulingConfig DefaultSchedulingConfig() {
  v1::SchedulingConfig config;
  ApplyDefaults(Positions(), &config);
  return config;
}

absl::StatusOr<Scheduler::Admission> Scheduler::Admit(
    const std::string& queue, const std::string& priority_class, const std::string& pool,
    int64_t smallest_size, const std::string& owner, const std::vector<std::string>& roles,
    bool admin) const {
  Admission admission;
  admission.queue = queue.empty() ? config_.default_queue() : queue;
  admission.priority_class =
      priority_class.empty() ? config_.default_priority_class() : priority_class;
  const v1::QueueConfig* q = nullptr;
  for (const v1::QueueConfig& c : config_.queues()) {
    if (c.name() == admission.queue) q = &c;
  }
  if (q == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown queue '", admission.queue,
                                                   "'; the queues are ", Names(config_.queues())));
  }
  const v1::PriorityClass* pc = nullptr;
  for (const v1::PriorityClass& c : config_.priority_classes()) {
    if (c.name() == admission.priority_class) pc = &c;
  }
  if (pc == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown priority class '",
                                                   admission.priority_class, "'; the classes are ",
                                                   Names(config_.priority_classes())));
  }
  admission.priority = pc->value();
  const auto& owners = q->submitters().owners();
  const auto& allowed_roles = q->submitters().roles();
  const bool anyone = owners.empty() && allowed_roles.empty();
  const bool listed =
      std::find(owners.begin(), owners.end(), owner) != owners.end() ||
      std::any_of(roles.begin(), roles.end(), [&](const std::string& role) {
        return std::find(allowed_roles.begin(), allowed_roles.end(), role) != allowed_roles.end();
      });
  if (!admin && !anyone && !listed) {
    return absl::PermissionDeniedError(absl::StrCat(
        "'", owner, "' may not submit to queue '", q->name(), "': its submitters are owners [",
        absl::StrJoin(owners, ", "), "] and roles [", absl::StrJoin(allowed_roles, ", "),
        "]; ask an administrator, or name another queue"));
  }
  const v1::DeviceQuota* quota = FindQuota(*q, pool);
  if (quota == nullptr) return admission;  // no quota for this pool: no limit
  // The most the queue could ever hold: its own devices plus all it may borrow.
  int64_t lendable = 0;
  if (!q->cohort().empty()) {
    for (const v1::QueueConfig& other : config_.queues()) {
      if (&other == q || other.cohort() != q->cohort()) continue;
      if (const v1::DeviceQuota* o = FindQuota(other, pool)) lendable += o->devices();
    }
  }
  const int64_t borrow =
      quota->has_borrowing_limit() ? std::min(lendable, quota->borrowing_limit()) : lendable;
  if (smallest_size > quota->devices() + borrow) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs at least ", smallest_size, " ", pool, " devices but queue '", q->name(),
        "' can never hold more than ", quota->devices() + borrow, " (its quota of ",
        quota->devices(),
        borrow > 0 ? absl::StrCat(" plus ", borrow, " borrowed from cohort '", q->cohort(), "'")
                   : std::string(),
        "); make the job smaller or submit it to a larger queue"));
  }
  return admission;
}

}  // namespace scheduling
}  // namespace substrax
