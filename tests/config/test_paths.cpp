// nvme_path's placeholders ({rank}, {local_rank}, {host}, $VAR) and the network file system
// warning's detection (config/paths.h); the zoe.comm_timeout_s key.
#include <gtest/gtest.h>

#include <sys/statfs.h>

#include <cstdlib>
#include <string>

#include "config/config.h"
#include "config/paths.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::config {
namespace {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

PathVars vars() {
  PathVars v;
  v.rank = 13;
  v.local_rank = 1;
  v.host = "gpu-node7";
  return v;
}

std::string expanded(const std::string& path) {
  auto r = expand_path("key", path, vars());
  EXPECT_OK(r) << path;
  return r.is_ok() ? r.value() : "";
}

std::string error_of(const std::string& path) {
  auto r = expand_path("zero_optimization.offload_param.nvme_path", path, vars());
  EXPECT_FALSE(r.is_ok()) << path << " expanded to " << (r.is_ok() ? r.value() : "");
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(NvmePath, PlaceholdersAndVariables) {
  setenv("ZOE_TEST_LOCAL_DIR", "/local/job42", 1);
  EXPECT_EQ(expanded("/nvme/zoe"), "/nvme/zoe");  // nothing to expand
  EXPECT_EQ(expanded("/nvme/{host}/r{rank}-l{local_rank}"), "/nvme/gpu-node7/r13-l1");
  EXPECT_EQ(expanded("$ZOE_TEST_LOCAL_DIR/zoe"), "/local/job42/zoe");
  EXPECT_EQ(expanded("${ZOE_TEST_LOCAL_DIR}x/{local_rank}"), "/local/job42x/1");
  EXPECT_EQ(expanded("/a/$$b/{rank}{rank}"), "/a/$b/1313");
  // Every entry of both blocks.
  Config c;
  c.zero.offload_optimizer.nvme_path = {"/o/{rank}", "$ZOE_TEST_LOCAL_DIR"};
  c.zero.offload_param.nvme_path = {"/p/{host}"};
  ASSERT_OK(expand_paths(&c, vars()));
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path[0], "/o/13");
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path[1], "/local/job42");
  EXPECT_EQ(c.zero.offload_param.nvme_path[0], "/p/gpu-node7");
  unsetenv("ZOE_TEST_LOCAL_DIR");
}

TEST(NvmePath, BadPlaceholdersAreErrorsNamingTheKeyAndThePath) {
  unsetenv("ZOE_TEST_UNSET_DIR");
  setenv("ZOE_TEST_EMPTY_DIR", "", 1);
  std::string e = error_of("/nvme/{node}");
  EXPECT_HAS(e, "zero_optimization.offload_param.nvme_path: '/nvme/{node}': unknown placeholder {node}");
  EXPECT_HAS(e, "{rank}, {local_rank}, {host}, $VAR");
  EXPECT_HAS(error_of("$ZOE_TEST_UNSET_DIR/zoe"),
             "the environment variable ZOE_TEST_UNSET_DIR is not set on host gpu-node7");
  EXPECT_HAS(error_of("${ZOE_TEST_EMPTY_DIR}/zoe"), "ZOE_TEST_EMPTY_DIR is empty");
  EXPECT_HAS(error_of("/nvme/{rank"), "\"{\" without its \"}\"");
  EXPECT_HAS(error_of("/nvme/${HOME"), "\"${\" without its \"}\"");
  EXPECT_HAS(error_of("/nvme/$/x"), "a \"$\" must begin an environment variable");
  Config c;
  c.zero.offload_param.nvme_path = {"/ok", "/bad/{x}"};
  EXPECT_HAS(expand_paths(&c, vars()).message(), "zero_optimization.offload_param.nvme_path: '/bad/{x}'");
  unsetenv("ZOE_TEST_EMPTY_DIR");
}

// docs/multinode.md: an unknown placeholder names the key, the path and the host.
TEST(NvmePath, UnknownPlaceholderNamesTheHost) {
  EXPECT_HAS(error_of("/nvme/{node}"), "unknown placeholder {node} on host gpu-node7");
}

// {host} is one directory's name: a host name that is empty, "." or "..", or that holds a "/",
// would put the swap files somewhere else, and is refused naming the placeholder and the host.
TEST(NvmePath, HostThatLeavesTheDirectoryIsRefused) {
  for (const std::string host : {"..", ".", "", "rack1/node7", "../etc"}) {
    PathVars v = vars();
    v.host = host;
    auto r = expand_path("zero_optimization.offload_param.nvme_path", "/nvme/{host}/zoe", v);
    ASSERT_FALSE(r.is_ok()) << "'" << host << "' expanded to " << r.value();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(r.status().message(),
               "zero_optimization.offload_param.nvme_path: '/nvme/{host}/zoe': {host} "
               "would expand to '" +
                   host + "', this host's name");
  }
  PathVars v = vars();
  v.host = "node..7";  // dots inside a name are a name
  auto r = expand_path("key", "/nvme/{host}", v);
  ASSERT_OK(r);
  EXPECT_EQ(r.value(), "/nvme/node..7");
}

// A directory check names the text as given where the expansion changed it: the key's (config)
// or the flag's (check_flag_dir), then the directory.
TEST(NvmePath, CheckNamesTheTextGivenAndTheExpansion) {
  test::ScratchDir dir("given");
  Config given;
  given.zero.stage = 3;
  given.zero.offload_param.device = Offload::kNvme;
  given.zero.offload_param.nvme_path = {dir.path(), dir.path() + "/{host}"};
  Config c = given;
  ASSERT_OK(expand_paths(&c, vars()));
  EXPECT_HAS(check_paths(c, given).message(), "zero_optimization.offload_param.nvme_path '" + dir.path() +
                                                  "/{host}': '" + dir.path() + "/gpu-node7' does not exist");
  auto f = check_flag_dir("--nvme-path", dir.path() + "/r{rank}", vars());
  ASSERT_FALSE(f.is_ok());
  EXPECT_HAS(f.status().message(),
             "--nvme-path '" + dir.path() + "/r{rank}': '" + dir.path() + "/r13' does not exist");
  f = check_flag_dir("--nvme-path", "/nvme/{node}", vars());
  ASSERT_FALSE(f.is_ok());
  EXPECT_HAS(f.status().message(),
             "--nvme-path: '/nvme/{node}': unknown placeholder {node} on host gpu-node7");
  f = check_flag_dir("--nvme-path", dir.path(), vars());  // nothing to expand: the flag and the directory
  ASSERT_OK(f);
  EXPECT_EQ(f.value(), dir.path());
  EXPECT_HAS(check_flag_dir("--nvme-path", "/proc", vars()).status().message(),
             "--nvme-path: '/proc' is on procfs");
}

TEST(NvmePath, ProcessVarsFromTheLauncher) {
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  PathVars v = process_path_vars();
  EXPECT_EQ(v.rank, 5);
  EXPECT_EQ(v.local_rank, 2);
  EXPECT_FALSE(v.host.empty());
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(NvmePath, NetworkFileSystemsAreRecognisedByTheirMagic) {
  EXPECT_STREQ(network_fs_name(0x6969), "NFS");
  EXPECT_STREQ(network_fs_name(0x0BD00BD0), "Lustre");
  EXPECT_STREQ(network_fs_name(0x47504653), "GPFS");
  EXPECT_STREQ(network_fs_name(static_cast<long>(0xFF534D42u)), "CIFS");
  EXPECT_EQ(network_fs_name(0xEF53), nullptr);      // ext4
  EXPECT_EQ(network_fs_name(0x58465342), nullptr);  // xfs
  EXPECT_EQ(network_fs_name(0x01021994), nullptr);  // tmpfs
  // The scratch directory of the tests is local here: check_paths passes it without a warning's
  // reason (whatever it is, the answer agrees with statfs).
  test::ScratchDir dir("paths");
  struct statfs fs {};
  ASSERT_EQ(statfs(dir.path().c_str(), &fs), 0);
  const char* name = network_fs_name(static_cast<long>(fs.f_type));
  Config c;
  c.zero.stage = 2;
  c.zero.offload_optimizer.device = Offload::kNvme;
  c.zero.offload_optimizer.nvme_path = {dir.path()};
  EXPECT_OK(check_paths(c)) << (name ? name : "local");
}

// zoe.comm_timeout_s: seconds, 0 (off) to a day; the engine applies it only when the file gives it.
TEST(CommTimeout, TheKeyIsBoundedAndKnownAsGiven) {
  auto c = Config::parse(R"({"zoe": {"comm_timeout_s": 5}})");
  ASSERT_OK(c);
  EXPECT_EQ(c->zoe.comm_timeout_s, 5.0);
  EXPECT_TRUE(c->given("zoe.comm_timeout_s"));
  auto d = Config::parse("{}");
  ASSERT_OK(d);
  EXPECT_EQ(d->zoe.comm_timeout_s, 30.0);
  EXPECT_FALSE(d->given("zoe.comm_timeout_s"));
  EXPECT_OK(Config::parse(R"({"zoe": {"comm_timeout_s": 0}})"));
  auto bad = Config::parse(R"({"zoe": {"comm_timeout_s": -1}})");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_HAS(bad.status().message(), "zoe.comm_timeout_s");
  EXPECT_FALSE(Config::parse(R"({"zoe": {"comm_timeout_s": "soon"}})").is_ok());
}

}  // namespace
}  // namespace zoe::config
