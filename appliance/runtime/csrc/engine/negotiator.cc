// What both protocols share: the report of this rank's waiting callers (negotiator.h's WaitReport).
#include "engine/negotiator.h"

namespace appliance {

WaitReport::WaitReport(double report_s)
    : on_(report_s > 0),
      after_(std::chrono::duration_cast<Time::duration>(std::chrono::duration<double>(report_s > 0 ? report_s : 0))) {}

bool WaitReport::update(Time since, Time now, Time* report) {
  since_ = since;
  if (!on_) return false;
  if (since == told_) return false;
  if (since != Time::max() && now >= since + after_) {
    told_ = *report = since;
    return true;
  }
  if (told_ == Time::max()) return false;
  told_ = *report = Time::max();  // no longer waits (or waits afresh, not yet long)
  return true;
}

WaitReport::Time WaitReport::next() const {
  if (!on_ || since_ == Time::max() || since_ == told_) return Time::max();
  return since_ + after_;
}

}  // namespace appliance
