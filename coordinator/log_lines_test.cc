#include "coordinator/log_lines.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace substrax {
namespace {

LogChunk Chunk(int process, int64_t offset, const std::string& data, bool eof = false) {
  LogChunk c;
  c.job_id = "demo-1";
  c.attempt = 1;
  c.process_index = process;
  c.offset = offset;
  c.host = process == 0 ? "host-a" : "host-b";
  c.data = data;
  c.eof = eof;
  return c;
}

TEST(LogAssemblerTest, WholeLinesOnlyUntilTheEnd) {
  LogAssembler assembler;
  std::vector<std::string> lines;
  EXPECT_EQ(assembler.Add(Chunk(0, 0, "one\ntw"), &lines), 0);
  EXPECT_EQ(lines, std::vector<std::string>({"one"}));
  assembler.Add(Chunk(0, 6, "o\nthr"), &lines);
  EXPECT_EQ(lines, std::vector<std::string>({"one", "two"}));
  EXPECT_FALSE(assembler.eof());
  // The process ended: its last line without a newline is shown.
  assembler.Add(Chunk(0, 11, "ee", /*eof=*/true), &lines);
  EXPECT_EQ(lines, std::vector<std::string>({"one", "two", "three"}));
  EXPECT_TRUE(assembler.eof());
  EXPECT_EQ(assembler.next(), 13);
}

TEST(LogAssemblerTest, SkipsKnownBytesAndCountsDroppedOnes) {
  LogAssembler assembler;
  std::vector<std::string> lines;
  // Retention dropped the first 100 bytes: the cut line before the first newline goes too.
  EXPECT_EQ(assembler.Add(Chunk(0, 100, "tail of a line\nnext\n"), &lines), 100);
  EXPECT_EQ(lines, std::vector<std::string>({"tail of a line", "next"}));
  lines.clear();
  // A chunk that overlaps what was read: only its new part counts.
  EXPECT_EQ(assembler.Add(Chunk(0, 115, "next\nnew\n"), &lines), 0);
  EXPECT_EQ(lines, std::vector<std::string>({"new"}));
}

TEST(LogAssemblerTest, AnEndlessLineComesInPieces) {
  LogAssembler assembler;
  std::vector<std::string> lines;
  assembler.Add(Chunk(0, 0, std::string(kMaxLogLineBytes + 10, 'x')), &lines);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].size(), kMaxLogLineBytes);
}

TEST(ValidUtf8Test, ReplacesWhatIsNotUtf8) {
  EXPECT_EQ(ValidUtf8("plain ascii"), "plain ascii");
  EXPECT_EQ(ValidUtf8("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");  // été
  EXPECT_EQ(ValidUtf8("a\xff" "b"), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(ValidUtf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong '/'
  EXPECT_EQ(ValidUtf8("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");  // cut short
}

class LogReaderTest : public ::testing::Test {
 protected:
  void Store(std::vector<LogChunk> chunks) {
    StateBatch batch;
    batch.log_chunks = std::move(chunks);
    ASSERT_TRUE(store_.Commit(batch).ok());
  }
  static std::vector<std::string> Texts(const std::vector<v1::ReadLogsResponse>& responses) {
    std::vector<std::string> texts;
    // A response's notices come before its lines (they say what is missing before them).
    for (const v1::ReadLogsResponse& r : responses) {
      for (const std::string& notice : r.notices()) texts.push_back("notice: " + notice);
      for (const v1::LogLine& line : r.lines()) {
        texts.push_back("p" + std::to_string(line.process_index()) + " " + line.host() + " " +
                        line.text());
      }
    }
    return texts;
  }

  InMemoryStateStore store_;
};

TEST_F(LogReaderTest, EveryProcessInOrderThenWhatArrivesLater) {
  Store({Chunk(1, 0, "b1\n"), Chunk(0, 0, "a1\na2\npart")});
  LogReader reader(&store_, "demo-1", 1, -1, 0);
  std::vector<v1::ReadLogsResponse> out;
  ASSERT_FALSE(*reader.Read(&out));
  EXPECT_EQ(Texts(out), std::vector<std::string>({"p0 host-a a1", "p0 host-a a2",
                                                  "p1 host-b b1"}));
  EXPECT_EQ(reader.complete(), 0);
  out.clear();
  Store({Chunk(0, 10, "ial\n", /*eof=*/true), Chunk(1, 3, "", /*eof=*/true)});
  ASSERT_FALSE(*reader.Read(&out));
  EXPECT_EQ(Texts(out), std::vector<std::string>({"p0 host-a partial"}));
  EXPECT_EQ(reader.complete(), 2);
  EXPECT_TRUE(reader.Incomplete(2, absl::Seconds(30)).empty());
}

TEST_F(LogReaderTest, OneProcessAndItsTail) {
  Store({Chunk(0, 0, "a1\na2\na3\na4\n"), Chunk(1, 0, "b1\nb2\n")});
  LogReader reader(&store_, "demo-1", 1, 1, /*tail_lines=*/1);
  std::vector<v1::ReadLogsResponse> out;
  ASSERT_TRUE(reader.Read(&out).ok());
  EXPECT_EQ(Texts(out), std::vector<std::string>({"p1 host-b b2"}));
  LogReader tail(&store_, "demo-1", 1, -1, 3);
  out.clear();
  ASSERT_TRUE(tail.Read(&out).ok());
  EXPECT_EQ(Texts(out), std::vector<std::string>({"p0 host-a a2", "p0 host-a a3", "p0 host-a a4",
                                                  "p1 host-b b1", "p1 host-b b2"}));
  // Process 1's log never ended: said so, naming it.
  std::vector<std::string> incomplete = tail.Incomplete(2, absl::Seconds(30));
  ASSERT_EQ(incomplete.size(), 2u);
  EXPECT_NE(incomplete[1].find("process 1 (host host-b)"), std::string::npos) << incomplete[1];
}

TEST_F(LogReaderTest, SaysHowManyBytesWereDropped) {
  Store({Chunk(0, 5000, "kept\n")});
  LogReader reader(&store_, "demo-1", 1, -1, 0);
  std::vector<v1::ReadLogsResponse> out;
  ASSERT_TRUE(reader.Read(&out).ok());
  std::vector<std::string> texts = Texts(out);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_NE(texts[0].find("[... 5000 earlier bytes dropped ...]"), std::string::npos) << texts[0];
  EXPECT_EQ(texts[1], "p0 host-a kept");
}

TEST_F(LogReaderTest, ReadsInPages) {
  std::vector<LogChunk> chunks;
  for (int i = 0; i < 10; ++i) chunks.push_back(Chunk(0, i * 4, "abc\n"));
  Store(chunks);
  LogReader reader(&store_, "demo-1", 1, -1, 0);
  std::vector<v1::ReadLogsResponse> out;
  int reads = 1;
  while (*reader.Read(&out, /*page_bytes=*/8)) ++reads;
  EXPECT_GT(reads, 1);
  EXPECT_EQ(Texts(out).size(), 10u);
}

}  // namespace
}  // namespace substrax
