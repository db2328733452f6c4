#include "client/certs_command.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/args.h"
#include "rpc/pki.h"

namespace substrax::ctl {
namespace {

constexpr int kMaxDays = 36500;
constexpr const char* kClientRoles[] = {"admin", "submitter", "viewer", "worker"};
constexpr const char* kTokenRoles[] = {"admin", "submitter", "viewer"};

template <size_t N>
bool OneOf(const std::string& value, const char* const (&options)[N]) {
  return std::find(std::begin(options), std::end(options), value) != std::end(options);
}

int Fail(const CommandContext& ctx, int code, absl::string_view message) {
  *ctx.err << "substraxctl: " << message << "\n";
  return code;
}

std::string Join(const std::string& dir, absl::string_view name) {
  return dir.empty() || dir.back() == '/' ? absl::StrCat(dir, name) : absl::StrCat(dir, "/", name);
}

std::string FormatTime(const CommandContext& ctx, absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", t, ctx.zone);
}

// "364d 23h", "5h 3m", "42s": how far a validity bound is from now.
std::string Span(absl::Duration d) {
  const int64_t s = absl::ToInt64Seconds(absl::AbsDuration(d));
  if (s >= 86400) return absl::StrFormat("%dd %dh", s / 86400, s % 86400 / 3600);
  if (s >= 3600) return absl::StrFormat("%dh %dm", s / 3600, s % 3600 / 60);
  if (s >= 60) return absl::StrFormat("%dm %ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

absl::Status CheckDays(int days) {
  if (days < 1 || days > kMaxDays) {
    return absl::InvalidArgumentError(
        absl::StrCat("--days must be 1 to ", kMaxDays, ", not ", days));
  }
  return absl::OkStatus();
}

// `dir` as a directory we may write keys into: created 0700 (it will hold private keys) with its
// parents when missing.
absl::Status EnsureDirectory(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return absl::OkStatus();
  if (std::filesystem::create_directories(dir, ec)) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec || !std::filesystem::is_directory(dir)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the directory ", dir, ": ", ec ? ec.message() : "not a directory",
        "; check the path and its parent's permissions"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view hint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno), hint));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// An error when any of `paths` exists and `force` is not set.
absl::Status CheckNotThere(const std::vector<std::string>& paths, bool force,
                           absl::string_view what) {
  if (force) return absl::OkStatus();
  for (const std::string& path : paths) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " already exists: ", what, "; pass --force to replace it"));
    }
  }
  return absl::OkStatus();
}

// Writes each (path, content, private?) in order; prints "wrote PATH (mode 0600)" for each.
struct OutputFile {
  std::string path;
  std::string content;
  bool is_private = false;
  std::string note;
};
absl::Status WriteAll(const CommandContext& ctx, const std::vector<OutputFile>& files) {
  for (const OutputFile& f : files) {
    absl::Status s = f.is_private ? pki::WritePrivateFile(f.path, f.content)
                                  : pki::WritePublicFile(f.path, f.content);
    if (!s.ok()) return s;
    *ctx.out << "wrote " << f.path << " (mode " << (f.is_private ? "0600" : "0644") << ")"
             << (f.note.empty() ? "" : ": ") << f.note << "\n";
  }
  return absl::OkStatus();
}

// A warning on ctx.err when the CA key may be read by others (a copy, a chmod, an old umask).
void WarnIfShared(const CommandContext& ctx, const std::string& key_path) {
  struct stat st;
  if (stat(key_path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    *ctx.err << absl::StrFormat(
        "substraxctl: warning: %s has mode %04o: others may read the CA's key; chmod 600 it\n",
        key_path, st.st_mode & 07777);
  }
}

}  // namespace

absl::Status CheckIdentityName(absl::string_view name) {
  const bool ends_ok = !name.empty() && absl::ascii_isalnum(name.front()) &&
                       absl::ascii_isalnum(name.back());
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isdigit(c) || absl::ascii_islower(c) || c == '-' || c == '.';
  });
  if (!ends_ok || !chars_ok || name.size() > 63) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--name \"", name, "\" is not an identity name: use 1 to 63 lowercase letters, digits, "
        "'-' and '.', starting and ending with a letter or digit (e.g. alice, worker-3)"));
  }
  return absl::OkStatus();
}

int CertsInitCommand(const CommandContext& ctx, const CertsInitFlags& flags) {
  if (flags.dir.empty()) return Fail(ctx, kExitUsage, "certs init needs --dir DIR");
  if (absl::Status s = CheckDays(flags.days); !s.ok()) return Fail(ctx, kExitUsage, s.message());
  const std::string dir = UserPath(flags.dir, ctx.working_directory);
  const std::string cert_path = Join(dir, "ca.crt");
  const std::string key_path = Join(dir, "ca.key");
  if (absl::Status s = CheckNotThere(
          {key_path, cert_path}, flags.force,
          "this directory holds a CA already (certificates it issued stop verifying if it is "
          "replaced); use it with `certs issue --ca-dir`, or choose another --dir");
      !s.ok()) {
    return Fail(ctx, kExitError, s.message());
  }
  const absl::Time now = ctx.clock();
  const absl::Time not_after = now + absl::Hours(24) * flags.days;
  absl::StatusOr<pki::KeyAndCert> ca =
      pki::CreateCertificateAuthority(flags.name, now - kCertificateBackdate, not_after);
  if (!ca.ok()) {
    // CreateCertificateAuthority's INVALID_ARGUMENT can only be the name: --days was checked.
    if (ca.status().code() == absl::StatusCode::kInvalidArgument) {
      return Fail(ctx, kExitUsage, absl::StrCat("--name \"", flags.name, "\": ",
                                                ca.status().message()));
    }
    return Fail(ctx, kExitError, absl::StrCat("cannot create the CA: ", ca.status().message()));
  }
  if (absl::Status s = EnsureDirectory(dir); !s.ok()) return Fail(ctx, kExitError, s.message());
  absl::Status written = WriteAll(
      ctx, {{key_path, ca->key_pem, true, "the CA's private key: keep it secret, and offline "
                                          "when not issuing"},
            {cert_path, ca->cert_pem, false,
             absl::StrCat("the CA certificate (CN ", flags.name, "), valid until ",
                          FormatTime(ctx, not_after), "; every peer trusts it")}});
  if (!written.ok()) return Fail(ctx, kExitError, written.message());
  return kExitOk;
}

int CertsIssueCommand(const CommandContext& ctx, const CertsIssueFlags& flags) {
  if (flags.ca_dir.empty() || flags.out_dir.empty() || flags.name.empty() ||
      flags.role.empty()) {
    return Fail(ctx, kExitUsage, "certs issue needs --ca-dir, --out-dir, --name and --role");
  }
  if (absl::Status s = CheckIdentityName(flags.name); !s.ok()) {
    return Fail(ctx, kExitUsage, s.message());
  }
  if (absl::Status s = CheckDays(flags.days); !s.ok()) return Fail(ctx, kExitUsage, s.message());
  const bool server = flags.role == "server";
  if (!server && !OneOf(flags.role, kClientRoles)) {
    return Fail(ctx, kExitUsage,
                absl::StrCat("--role \"", flags.role,
                             "\" is not a role: use admin, submitter, viewer, worker (client "
                             "certificates) or server (the coordinator's)"));
  }
  if (server && flags.dns.empty() && flags.ip.empty()) {
    return Fail(ctx, kExitUsage,
                "a server certificate needs at least one --dns or --ip: the names and addresses "
                "clients dial it by (e.g. --dns substrax-coordinator.substrax.svc --ip 10.0.0.5)");
  }
  if (!server && (!flags.dns.empty() || !flags.ip.empty())) {
    return Fail(ctx, kExitUsage,
                absl::StrCat("--dns and --ip are for --role server; a ", flags.role,
                             " certificate is known by its --name alone"));
  }

  const absl::Time now = ctx.clock();
  const pki::CertificateRequest request =
      pki::RequestFor(flags.name, flags.role, flags.dns, flags.ip, now - kCertificateBackdate,
                      now + absl::Hours(24) * flags.days);
  if (absl::Status s = pki::ValidateCertificateRequest(request); !s.ok()) {
    return Fail(ctx, kExitUsage, s.message());
  }

  const std::string ca_dir = UserPath(flags.ca_dir, ctx.working_directory);
  const std::string ca_cert_path = Join(ca_dir, "ca.crt");
  const std::string ca_key_path = Join(ca_dir, "ca.key");
  const std::string no_ca = absl::StrCat(
      "; run `substraxctl certs init --dir ", flags.ca_dir,
      "` first, or give the directory that holds ca.crt and ca.key as --ca-dir");
  pki::KeyAndCert ca;
  for (auto [path, content] : {std::pair{&ca_cert_path, &ca.cert_pem},
                               std::pair{&ca_key_path, &ca.key_pem}}) {
    absl::StatusOr<std::string> text = ReadFile(*path, no_ca);
    if (!text.ok()) return Fail(ctx, kExitError, text.status().message());
    *content = *std::move(text);
  }
  WarnIfShared(ctx, ca_key_path);

  const std::string out_dir = UserPath(flags.out_dir, ctx.working_directory);
  const std::string cert_path = Join(out_dir, flags.name + ".crt");
  const std::string key_path = Join(out_dir, flags.name + ".key");
  if (absl::Status s = CheckNotThere({key_path, cert_path}, flags.force,
                                     "a certificate was issued to this name before");
      !s.ok()) {
    return Fail(ctx, kExitError, s.message());
  }
  absl::StatusOr<pki::KeyAndCert> issued = pki::IssueCertificate(ca, request);
  if (!issued.ok()) {
    return Fail(ctx, kExitError,
                absl::StrCat("cannot issue with the CA in ", ca_dir, " (", ca_cert_path, ", ",
                             ca_key_path, "): ", issued.status().message()));
  }
  if (absl::Status s = EnsureDirectory(out_dir); !s.ok()) {
    return Fail(ctx, kExitError, s.message());
  }
  std::vector<std::string> alt_names = flags.dns;
  alt_names.insert(alt_names.end(), flags.ip.begin(), flags.ip.end());
  const std::string what =
      server ? absl::StrCat("server certificate, CN ", flags.name, ", for ",
                            absl::StrJoin(alt_names, ", "))
             : absl::StrCat("client certificate, CN ", flags.name, ", role ", flags.role);
  absl::Status written = WriteAll(
      ctx, {{key_path, issued->key_pem, true, "its private key"},
            {cert_path, issued->cert_pem, false,
             absl::StrCat(what, ", expires ", FormatTime(ctx, request.not_after))},
            {Join(out_dir, "ca.crt"), ca.cert_pem, false, "the CA certificate, to verify peers"}});
  if (!written.ok()) return Fail(ctx, kExitError, written.message());
  return kExitOk;
}

int CertsTokenCommand(const CommandContext& ctx, const std::string& name,
                      const std::string& role) {
  if (absl::Status s = CheckIdentityName(name); !s.ok()) {
    return Fail(ctx, kExitUsage, s.message());
  }
  if (!OneOf(role, kTokenRoles)) {
    return Fail(ctx, kExitUsage,
                absl::StrCat("--role \"", role,
                             "\" is not a token role: use admin, submitter or viewer (workers "
                             "authenticate with certificates: `certs issue --role worker`)"));
  }
  const std::string token = pki::RandomToken();
  *ctx.out << token << "\n";
  *ctx.err << "# The token above is shown only this once. Add this entry to the coordinator's\n"
              "# --auth-config file (under its `tokens:` list if it has one already):\n"
           << "tokens:\n"
           << "- name: " << name << "\n"
           << "  role: " << role << "\n"
           << "  sha256: " << pki::Sha256Hex(token) << "\n";
  return kExitOk;
}

int CertsShowCommand(const CommandContext& ctx, const std::string& path) {
  const std::string file = UserPath(path, ctx.working_directory);
  absl::StatusOr<std::string> text = ReadFile(file, "; check the path");
  if (!text.ok()) return Fail(ctx, kExitError, text.status().message());
  absl::StatusOr<pki::CertificateInfo> info = pki::ParseCertificate(*text);
  if (!info.ok()) {
    return Fail(ctx, kExitError,
                absl::StrCat(file, ": ", info.status().message(),
                             "; give a certificate file (.crt, PEM), not a key"));
  }
  std::vector<std::string> usages;
  if (info->is_ca) usages.push_back("CA");
  if (info->server_auth) usages.push_back("server");
  if (info->client_auth) usages.push_back("client");
  const std::vector<std::string> roles = pki::RolesOf(*info);
  const absl::Time now = ctx.clock();
  std::string status;
  if (now < info->not_before) {
    status = absl::StrCat("not yet valid (starts in ", Span(info->not_before - now), ")");
  } else if (now >= info->not_after) {
    status = absl::StrCat("EXPIRED ", Span(now - info->not_after), " ago");
  } else {
    status = absl::StrCat("valid (expires in ", Span(info->not_after - now), ")");
  }
  auto line = [&ctx](absl::string_view key, absl::string_view value) {
    *ctx.out << absl::StrFormat("%-13s %s\n", absl::StrCat(key, ":"), value);
  };
  line("file", file);
  line("subject", absl::StrCat("CN=", info->common_name));
  line("roles", roles.empty() ? "none" : absl::StrJoin(roles, ", "));
  if (info->organizations.size() != roles.size()) {
    line("organization", absl::StrJoin(info->organizations, ", "));
  }
  line("usage", usages.empty() ? "any" : absl::StrJoin(usages, ", "));
  if (!info->dns_names.empty()) line("dns names", absl::StrJoin(info->dns_names, ", "));
  if (!info->ip_addresses.empty()) line("ip addresses", absl::StrJoin(info->ip_addresses, ", "));
  line("issuer", absl::StrCat("CN=", info->issuer_common_name));
  line("not before", FormatTime(ctx, info->not_before));
  line("not after", FormatTime(ctx, info->not_after));
  line("serial", info->serial_hex);
  line("status", status);
  return kExitOk;
}

}  // namespace substrax::ctl
