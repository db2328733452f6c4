// substraxctl certs against files in the test's temporary directory, with a fixed clock: exit
// codes, outputs, file modes and what the certificates say (rpc/pki.h reads them back).
#include "client/certs_command.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/pki.h"

namespace substrax::ctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

mode_t Mode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

pki::CertificateInfo Parse(const std::string& path) {
  absl::StatusOr<pki::CertificateInfo> info = pki::ParseCertificate(Read(path));
  EXPECT_TRUE(info.ok()) << path << ": " << info.status();
  return info.ok() ? *info : pki::CertificateInfo{};
}

class CertsCommandTest : public ::testing::Test {
 protected:
  CertsCommandTest() {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", test->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    ctx_.out = &out_;
    ctx_.err = &err_;
    ctx_.zone = absl::UTCTimeZone();
    ctx_.clock = [this] { return now_; };
    ctx_.working_directory = root_;  // relative paths below are relative to root_
  }

  int Init(CertsInitFlags flags = {}) {
    if (flags.dir.empty()) flags.dir = "ca";
    return CertsInitCommand(ctx_, flags);
  }

  CertsIssueFlags Flags(const std::string& name, const std::string& role) {
    CertsIssueFlags flags;
    flags.ca_dir = "ca";
    flags.out_dir = "out";
    flags.name = name;
    flags.role = role;
    return flags;
  }

  std::string Path(const std::string& relative) { return absl::StrCat(root_, "/", relative); }

  void Reset() {
    out_.str("");
    err_.str("");
  }

  absl::Time now_ = absl::FromUnixSeconds(1777593600);  // 2026-05-01 00:00:00 UTC
  std::string root_;
  std::ostringstream out_, err_;
  CommandContext ctx_;
};

TEST_F(CertsCommandTest, InitWritesCaWithModes) {
  ASSERT_EQ(Init(), kExitOk) << err_.str();
  EXPECT_EQ(Mode(Path("ca")), 0700u);
  EXPECT_EQ(Mode(Path("ca/ca.key")), 0600u);
  EXPECT_EQ(Mode(Path("ca/ca.crt")), 0644u);
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("wrote ", Path("ca/ca.key"), " (mode 0600)")));
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("wrote ", Path("ca/ca.crt"), " (mode 0644)")));
  EXPECT_THAT(out_.str(), HasSubstr("valid until 2036-04-28 00:00:00 UTC"));
  const pki::CertificateInfo ca = Parse(Path("ca/ca.crt"));
  EXPECT_EQ(ca.common_name, "substrax-ca");
  EXPECT_TRUE(ca.is_ca);
  EXPECT_EQ(ca.not_before, now_ - kCertificateBackdate);
  EXPECT_EQ(ca.not_after, now_ + absl::Hours(24 * 3650));
  EXPECT_THAT(err_.str(), IsEmpty());
}

TEST_F(CertsCommandTest, InitRefusesToReplaceACaUnlessForced) {
  ASSERT_EQ(Init(), kExitOk);
  const std::string first = Read(Path("ca/ca.key"));
  Reset();
  EXPECT_EQ(Init(), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr(Path("ca/ca.key") + " already exists"));
  EXPECT_THAT(err_.str(), HasSubstr("--force"));
  EXPECT_EQ(Read(Path("ca/ca.key")), first);

  CertsInitFlags flags;
  flags.force = true;
  flags.name = "other-ca";
  EXPECT_EQ(Init(flags), kExitOk) << err_.str();
  EXPECT_NE(Read(Path("ca/ca.key")), first);
  EXPECT_EQ(Parse(Path("ca/ca.crt")).common_name, "other-ca");
}

TEST_F(CertsCommandTest, InitRejectsBadFlags) {
  CertsInitFlags flags;
  flags.days = 0;
  EXPECT_EQ(Init(flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--days must be 1 to 36500"));
  flags.days = 10;
  flags.name = "";
  EXPECT_EQ(Init(flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--name \"\": a certificate's CN must have 1 to 64"));
  EXPECT_FALSE(std::filesystem::exists(Path("ca")));
}

TEST_F(CertsCommandTest, IssueClientCertificate) {
  ASSERT_EQ(Init(), kExitOk);
  Reset();
  ASSERT_EQ(CertsIssueCommand(ctx_, Flags("alice", "submitter")), kExitOk) << err_.str();
  EXPECT_EQ(Mode(Path("out/alice.key")), 0600u);
  EXPECT_EQ(Mode(Path("out/alice.crt")), 0644u);
  EXPECT_EQ(Mode(Path("out/ca.crt")), 0644u);
  EXPECT_EQ(Read(Path("out/ca.crt")), Read(Path("ca/ca.crt")));
  EXPECT_THAT(out_.str(), HasSubstr("client certificate, CN alice, role submitter, expires "
                                    "2027-05-01 00:00:00 UTC"));
  const pki::CertificateInfo cert = Parse(Path("out/alice.crt"));
  EXPECT_EQ(cert.common_name, "alice");
  EXPECT_THAT(cert.organizations, ElementsAre("substrax:submitter"));
  EXPECT_EQ(cert.issuer_common_name, "substrax-ca");
  EXPECT_TRUE(cert.client_auth);
  EXPECT_FALSE(cert.server_auth);
  EXPECT_EQ(cert.not_after, now_ + absl::Hours(24 * 365));
  EXPECT_THAT(err_.str(), IsEmpty());
}

TEST_F(CertsCommandTest, IssueServerCertificateNeedsNames) {
  ASSERT_EQ(Init(), kExitOk);
  Reset();
  CertsIssueFlags flags = Flags("substrax-coordinator", "server");
  EXPECT_EQ(CertsIssueCommand(ctx_, flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("needs at least one --dns or --ip"));
  EXPECT_FALSE(std::filesystem::exists(Path("out")));

  flags.dns = {"localhost", "coordinator.substrax.svc"};
  flags.ip = {"127.0.0.1", "fd00::7"};
  ASSERT_EQ(CertsIssueCommand(ctx_, flags), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("server certificate, CN substrax-coordinator, for localhost, "
                                    "coordinator.substrax.svc, 127.0.0.1, fd00::7"));
  const pki::CertificateInfo cert = Parse(Path("out/substrax-coordinator.crt"));
  EXPECT_EQ(cert.common_name, "substrax-coordinator");
  EXPECT_THAT(cert.organizations, IsEmpty());
  EXPECT_THAT(cert.dns_names, ElementsAre("localhost", "coordinator.substrax.svc"));
  EXPECT_THAT(cert.ip_addresses, ElementsAre("127.0.0.1", "fd00::7"));
  EXPECT_TRUE(cert.server_auth);
  EXPECT_FALSE(cert.client_auth);
}

TEST_F(CertsCommandTest, IssueRejectsBadFlags) {
  ASSERT_EQ(Init(), kExitOk);
  struct Case {
    const char* what;
    std::function<void(CertsIssueFlags&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"upper case", [](auto& f) { f.name = "Alice"; }, "not an identity name"},
      {"underscore", [](auto& f) { f.name = "a_b"; }, "not an identity name"},
      {"leading dash", [](auto& f) { f.name = "-a"; }, "not an identity name"},
      {"too long", [](auto& f) { f.name = std::string(64, 'a'); }, "not an identity name"},
      {"role", [](auto& f) { f.role = "root"; }, "\"root\" is not a role"},
      {"days", [](auto& f) { f.days = 40000; }, "--days must be"},
      {"SAN on client", [](auto& f) { f.dns = {"x.com"}; }, "--dns and --ip are for --role server"},
      {"bad IP", [](auto& f) { f.role = "server"; f.ip = {"10.0.0.300"}; }, "not an IP address"},
      {"bad DNS", [](auto& f) { f.role = "server"; f.dns = {"a b"}; }, "not a DNS name"},
      {"missing", [](auto& f) { f.out_dir = ""; }, "needs --ca-dir, --out-dir, --name and --role"},
  };
  for (const Case& c : cases) {
    Reset();
    CertsIssueFlags flags = Flags("alice", "admin");
    c.change(flags);
    EXPECT_EQ(CertsIssueCommand(ctx_, flags), kExitUsage) << c.what;
    EXPECT_THAT(err_.str(), HasSubstr(c.message)) << c.what;
  }
  EXPECT_FALSE(std::filesystem::exists(Path("out")));
}

TEST_F(CertsCommandTest, IssueWithoutCaSaysToRunInit) {
  EXPECT_EQ(CertsIssueCommand(ctx_, Flags("alice", "viewer")), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read " + Path("ca/ca.crt")));
  EXPECT_THAT(err_.str(), HasSubstr("run `substraxctl certs init --dir ca` first"));
}

TEST_F(CertsCommandTest, IssueRefusesToOutliveTheCa) {
  CertsInitFlags init;
  init.days = 30;
  ASSERT_EQ(Init(init), kExitOk);
  Reset();
  EXPECT_EQ(CertsIssueCommand(ctx_, Flags("alice", "viewer")), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("cannot issue with the CA in " + Path("ca")));
  EXPECT_THAT(err_.str(), HasSubstr("issue it for fewer days or renew the CA"));
  EXPECT_FALSE(std::filesystem::exists(Path("out/alice.key")));
}

TEST_F(CertsCommandTest, IssueRefusesToReplaceUnlessForced) {
  ASSERT_EQ(Init(), kExitOk);
  ASSERT_EQ(CertsIssueCommand(ctx_, Flags("w-1", "worker")), kExitOk);
  const std::string key = Read(Path("out/w-1.key"));
  Reset();
  EXPECT_EQ(CertsIssueCommand(ctx_, Flags("w-1", "worker")), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr(Path("out/w-1.key") + " already exists"));
  EXPECT_EQ(Read(Path("out/w-1.key")), key);
  CertsIssueFlags flags = Flags("w-1", "worker");
  flags.force = true;
  EXPECT_EQ(CertsIssueCommand(ctx_, flags), kExitOk) << err_.str();
  EXPECT_NE(Read(Path("out/w-1.key")), key);
}

TEST_F(CertsCommandTest, IssueWarnsAboutAReadableCaKey) {
  ASSERT_EQ(Init(), kExitOk);
  ASSERT_EQ(chmod(Path("ca/ca.key").c_str(), 0644), 0);
  Reset();
  EXPECT_EQ(CertsIssueCommand(ctx_, Flags("bob", "viewer")), kExitOk);
  EXPECT_THAT(err_.str(), HasSubstr("warning: " + Path("ca/ca.key") + " has mode 0644"));
}

TEST_F(CertsCommandTest, TokenPrintsTokenAloneAndItsDigest) {
  ASSERT_EQ(CertsTokenCommand(ctx_, "alice", "submitter"), kExitOk);
  const std::string out = out_.str();
  ASSERT_EQ(out.size(), 44u) << out;  // 43 characters and the newline
  const std::string token = out.substr(0, 43);
  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat("tokens:\n- name: alice\n  role: submitter\n"
                                                 "  sha256: ",
                                                 pki::Sha256Hex(token), "\n")));
  EXPECT_THAT(err_.str(), Not(HasSubstr(token)));
}

TEST_F(CertsCommandTest, TokenRejectsBadNameAndRole) {
  EXPECT_EQ(CertsTokenCommand(ctx_, "alice", "worker"), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("use admin, submitter or viewer"));
  EXPECT_EQ(CertsTokenCommand(ctx_, "Alice", "viewer"), kExitUsage);
  EXPECT_THAT(out_.str(), IsEmpty());
}

TEST_F(CertsCommandTest, ShowDescribesACertificate) {
  ASSERT_EQ(Init(), kExitOk);
  CertsIssueFlags flags = Flags("substrax-coordinator", "server");
  flags.dns = {"localhost"};
  flags.ip = {"127.0.0.1"};
  ASSERT_EQ(CertsIssueCommand(ctx_, flags), kExitOk);
  const std::string serial = Parse(Path("out/substrax-coordinator.crt")).serial_hex;
  Reset();
  ASSERT_EQ(CertsShowCommand(ctx_, "out/substrax-coordinator.crt"), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), absl::StrCat("file:         ", Path("out/substrax-coordinator.crt"), "\n",
                                     "subject:      CN=substrax-coordinator\n"
                                     "roles:        none\n"
                                     "usage:        server\n"
                                     "dns names:    localhost\n"
                                     "ip addresses: 127.0.0.1\n"
                                     "issuer:       CN=substrax-ca\n"
                                     "not before:   2026-04-30 23:55:00 UTC\n"
                                     "not after:    2027-05-01 00:00:00 UTC\n"
                                     "serial:       ",
                                     serial, "\n", "status:       valid (expires in 365d 0h)\n"));
}

TEST_F(CertsCommandTest, ShowSaysExpired) {
  ASSERT_EQ(Init(), kExitOk);
  ASSERT_EQ(CertsIssueCommand(ctx_, Flags("alice", "admin")), kExitOk);
  now_ += absl::Hours(24 * 366);
  Reset();
  ASSERT_EQ(CertsShowCommand(ctx_, "out/alice.crt"), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("roles:        admin\n"));
  EXPECT_THAT(out_.str(), HasSubstr("usage:        client\n"));
  EXPECT_THAT(out_.str(), HasSubstr("status:       EXPIRED 1d 0h ago\n"));
}

TEST_F(CertsCommandTest, ShowNamesTheFileItCannotUse) {
  EXPECT_EQ(CertsShowCommand(ctx_, "nothing.crt"), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read " + Path("nothing.crt")));
  ASSERT_EQ(Init(), kExitOk);
  Reset();
  EXPECT_EQ(CertsShowCommand(ctx_, "ca/ca.key"), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr(Path("ca/ca.key") + ": no PEM certificate"));
  EXPECT_THAT(err_.str(), HasSubstr("not a key"));
}

}  // namespace
}  // namespace substrax::ctl
