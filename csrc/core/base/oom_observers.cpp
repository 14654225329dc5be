#include "core/base/oom_observers.h"

namespace torchmem {

namespace {
// Set while this thread runs observers: an OOM inside one is not reported again.
thread_local bool t_notifying = false;
}  // namespace

uint64_t OomObservers::add(Observer observer) {
  auto shared = std::make_shared<const Observer>(std::move(observer));
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto next = std::make_shared<List>(*observers_);
  const uint64_t id = next_id_++;
  next->emplace_back(id, std::move(shared));
  observers_ = std::move(next);
  return id;
}

bool OomObservers::remove(uint64_t id) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto next = std::make_shared<List>();
  for (const auto& entry : *observers_) {
    if (entry.first != id) next->push_back(entry);
  }
  if (next->size() == observers_->size()) return false;
  observers_ = std::move(next);
  return true;
}

bool OomObservers::empty() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return observers_->empty();
}

std::string OomObservers::notify(int device, const OomInfo& info) const noexcept {
  if (t_notifying) return {};
  std::shared_ptr<const List> observers;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    observers = observers_;
  }
  if (observers->empty()) return {};
  t_notifying = true;
  std::string notes;
  for (const auto& entry : *observers) {
    try {
      std::string note = (*entry.second)(device, info);
      if (!note.empty()) notes += "\n" + note;
    } catch (const std::exception& e) {
      try {
        notes += "\ntorchmem: an out-of-memory observer failed: " + std::string(e.what());
      } catch (...) {  // no memory left even for the note: the error itself still goes out
      }
    } catch (...) {
      try {
        notes += "\ntorchmem: an out-of-memory observer failed";
      } catch (...) {
      }
    }
  }
  t_notifying = false;
  return notes;
}

}  // namespace torchmem
