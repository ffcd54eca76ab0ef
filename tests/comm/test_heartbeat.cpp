// The heartbeat that finds a lost rank (comm/heartbeat.h), with the ranks as threads of one process
// over loopback TCP: nobody is lost while every rank beats (a rank whose caller is busy for longer
// than the timeout included) or leaves with a goodbye; a rank gone silent (its link down) is lost
// after the timeout, a rank whose connections close at once (killed) is lost at once, rank 0
// relays the loss to the ranks that do not watch the lost one, and the ranks lose rank 0 itself.
// A rank that left with a goodbye is lost to a rank that then waits in a collective for the timeout
// (it will never come), named with the exit status its goodbye said; while nobody waits it is not.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/heartbeat.h"

namespace zoe::comm {
namespace {

using Clock = std::chrono::steady_clock;

// The ranks' exchange within one process: a generation barrier that carries values.
class Group {
 public:
  explicit Group(int size) : size_(size), hosts_(size) {}

  HeartbeatExchange exchange(int rank) {
    HeartbeatExchange ex;
    ex.share_from_rank0 = [this, rank](std::string* text) {
      std::unique_lock<std::mutex> lock(mu_);
      if (rank == 0) text0_ = *text;
      arrive(lock);
      *text = text0_;
      arrive(lock);
      return Status::ok();
    };
    ex.gather_hosts = [this, rank](const std::string& mine, std::vector<std::string>* all) {
      std::unique_lock<std::mutex> lock(mu_);
      hosts_[rank] = mine;
      arrive(lock);
      *all = hosts_;
      arrive(lock);
      return Status::ok();
    };
    ex.all_ok = [this](bool mine, bool* all) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!mine) failed_ = true;
      arrive(lock);
      *all = !failed_;
      arrive(lock);
      return Status::ok();
    };
    return ex;
  }

 private:
  void arrive(std::unique_lock<std::mutex>& lock) {
    const int gen = gen_;
    if (++count_ == size_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const int size_;
  int count_ = 0, gen_ = 0;
  std::string text0_;
  std::vector<std::string> hosts_;
  bool failed_ = false;
};

// What each rank's handler saw.
struct Seen {
  std::mutex mu;
  std::vector<LostRank> lost;  // by rank; .rank -1 while none
  explicit Seen(int size) : lost(size) {}
  LostRank get(int r) {
    std::lock_guard<std::mutex> lock(mu);
    return lost[r];
  }
};

// Since when each rank "waits in a collective" (steady-clock ns, 0: not), as MPI's guard says.
struct Waiting {
  std::vector<std::atomic<int64_t>> since;
  explicit Waiting(int size) : since(size) {}
  void enter(int r) {
    since[r].store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
  }
};

// `size` ranks with hosts "hostR" (rank 0's host shared by rank 1 when share_host), started together.
std::vector<std::unique_ptr<Heartbeat>> start_ranks(int size, double timeout_s, Seen* seen,
                                                    bool share_host = false, Waiting* waiting = nullptr) {
  Group group(size);
  std::vector<std::unique_ptr<Heartbeat>> hbs(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      HeartbeatOptions o;
      o.timeout_s = timeout_s;
      o.connect_timeout_s = 10;
      if (waiting) o.waiting_since = [waiting, r] { return waiting->since[r].load(); };
      const std::string host = "host" + std::to_string(share_host && r == 1 ? 0 : r);
      auto hb = Heartbeat::start(r, size, host, group.exchange(r), o, [seen, r](const LostRank& l) {
        std::lock_guard<std::mutex> lock(seen->mu);
        seen->lost[r] = l;
      });
      ASSERT_TRUE(hb.is_ok()) << hb.status().to_string();
      hbs[r] = std::move(hb).value();
    });
  }
  for (auto& t : threads) t.join();
  return hbs;
}

// Waits until rank r saw a loss, at most `limit` seconds; returns the seconds it took (-1: none).
double wait_lost(Seen& seen, int r, double limit) {
  const auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < limit) {
    if (seen.get(r).rank >= 0) return std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

TEST(Heartbeat, NobodyIsLostWhileEveryRankBeatsAndLeavesWithAGoodbye) {
  Seen seen(4);
  auto hbs = start_ranks(4, 0.3, &seen, /*share_host=*/true);
  ASSERT_EQ(hbs.size(), 4u);
  EXPECT_EQ(hbs[2]->hosts()[1], "host0");
  EXPECT_EQ(hbs[2]->hosts()[3], "host3");
  // Ten timeouts of beating, while the "callers" (this thread) do nothing with the heartbeat: a long
  // step does not stop the beats.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  // The ranks leave one by one, rank 0 in the middle: a goodbye is not a loss.
  hbs[3]->stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  hbs[0]->stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  hbs[1]->stop();
  hbs[2]->stop();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(seen.get(r).rank, -1) << "rank " << r << ": " << seen.get(r).why;
}

TEST(Heartbeat, ASilentRankIsLostAfterTheTimeoutAndRankZeroTellsTheOthers) {
  Seen seen(3);
  auto hbs = start_ranks(3, 0.5, &seen);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  hbs[2]->go_silent_for_test();  // its link is down: no beat, no goodbye, no close
  const double t0 = wait_lost(seen, 0, 5.0);
  const double t1 = wait_lost(seen, 1, 5.0);
  ASSERT_GE(t0, 0) << "rank 0 did not lose rank 2";
  ASSERT_GE(t1, 0) << "rank 1 did not learn of rank 2's loss";
  EXPECT_GE(t0, 0.3);  // not before the timeout (0.5 s, less the 0.3 s rank 2 was quiet before it)
  LostRank l0 = seen.get(0), l1 = seen.get(1);
  EXPECT_EQ(l0.rank, 2);
  EXPECT_EQ(l0.host, "host2");
  EXPECT_FALSE(l0.relayed);
  EXPECT_NE(l0.why.find("no heartbeat"), std::string::npos) << l0.why;
  EXPECT_EQ(l1.rank, 2);
  EXPECT_EQ(l1.host, "host2");
  EXPECT_TRUE(l1.relayed);
  for (auto& h : hbs) h->stop();
}

TEST(Heartbeat, AKilledRankIsLostAtOnce) {
  Seen seen(3);
  auto hbs = start_ranks(3, 30.0, &seen);  // a timeout far longer than the test
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  hbs[1]->drop_for_test();  // its connections close without a goodbye
  const double t0 = wait_lost(seen, 0, 5.0);
  const double t2 = wait_lost(seen, 2, 5.0);
  ASSERT_GE(t0, 0);
  ASSERT_GE(t2, 0);
  EXPECT_LT(t0, 2.0);
  EXPECT_EQ(seen.get(0).rank, 1);
  EXPECT_NE(seen.get(0).why.find("connection closed"), std::string::npos) << seen.get(0).why;
  EXPECT_EQ(seen.get(2).rank, 1);
  EXPECT_NE(seen.get(2).why.find("connection close"), std::string::npos) << seen.get(2).why;
  for (auto& h : hbs) h->stop();
}

TEST(Heartbeat, TheRanksLoseRankZero) {
  Seen seen(3);
  auto hbs = start_ranks(3, 0.5, &seen);
  hbs[0]->go_silent_for_test();
  ASSERT_GE(wait_lost(seen, 1, 5.0), 0);
  ASSERT_GE(wait_lost(seen, 2, 5.0), 0);
  EXPECT_EQ(seen.get(1).rank, 0);
  EXPECT_EQ(seen.get(1).host, "host0");
  EXPECT_EQ(seen.get(2).rank, 0);
  for (auto& h : hbs) h->stop();
}

TEST(Heartbeat, ALongerTimeoutSetLaterHolds) {
  Seen seen(2);
  auto hbs = start_ranks(2, 0.3, &seen);
  for (auto& h : hbs) h->set_timeout(5.0);
  hbs[1]->go_silent_for_test();
  EXPECT_LT(wait_lost(seen, 0, 1.5), 0) << "lost after the old timeout: " << seen.get(0).why;
  for (auto& h : hbs) h->set_timeout(0.3);
  EXPECT_GE(wait_lost(seen, 0, 3.0), 0);
  for (auto& h : hbs) h->stop();
}

TEST(Heartbeat, ARankThatLeftIsLostToTheRanksWaitingForItInACollective) {
  Seen seen(3);
  Waiting waiting(3);
  // A timeout of 2 s: a shorter one can pass while a loaded machine (the tests run two at a time)
  // starves rank 1's heartbeat thread before its goodbye, and rank 0 then loses it to silence.
  auto hbs = start_ranks(3, 2.0, &seen, false, &waiting);
  // Rank 1 fails alone and leaves (its goodbye says exit status 1) while ranks 0 and 2 wait for it
  // in a collective: rank 0 sees the goodbye, rank 2 hears it relayed.
  waiting.enter(0);
  waiting.enter(2);
  Departure d;
  d.exit_status = 1;
  hbs[1]->set_departure(d);
  hbs[1]->stop();
  const double t0 = wait_lost(seen, 0, 10.0);
  const double t2 = wait_lost(seen, 2, 10.0);
  ASSERT_GE(t0, 0) << "rank 0 waits forever for a rank that left";
  ASSERT_GE(t2, 0) << "rank 2 waits forever for a rank that left";
  EXPECT_GE(t0, 1.9);  // not before the timeout
  for (int r : {0, 2}) {
    const LostRank l = seen.get(r);
    EXPECT_EQ(l.rank, 1);
    EXPECT_EQ(l.host, "host1");
    EXPECT_NE(l.why.find("it left the job (exit status 1), and this rank has waited for it in a collective"),
              std::string::npos)
        << l.why;
  }
  EXPECT_FALSE(seen.get(0).relayed);
  EXPECT_TRUE(seen.get(2).relayed);
  for (auto& h : hbs) h->stop();
}

TEST(Heartbeat, ARankThatLeftIsNotLostWhileNobodyWaitsForIt) {
  Seen seen(2);
  Waiting waiting(2);
  auto hbs = start_ranks(2, 0.3, &seen, false, &waiting);
  Departure d;
  d.exit_status = 143;
  d.signal = SIGTERM;
  hbs[0]->set_departure(d);
  hbs[0]->stop();  // rank 0 leaves first: the job's end, rank 1 still writing its own output
  EXPECT_LT(wait_lost(seen, 1, 1.5), 0) << "lost while no collective waits: " << seen.get(1).why;
  waiting.enter(1);  // then a collective: it can never complete
  ASSERT_GE(wait_lost(seen, 1, 3.0), 0);
  EXPECT_EQ(seen.get(1).rank, 0);
  EXPECT_NE(seen.get(1).why.find("it left the job (stopped by SIGTERM, exit status 143)"), std::string::npos)
      << seen.get(1).why;
  for (auto& h : hbs) h->stop();
}

}  // namespace
}  // namespace zoe::comm
