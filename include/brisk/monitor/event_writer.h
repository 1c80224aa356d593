// TensorBoard event files (docs/monitoring.md): what `tensorboard --logdir`
// reads. A file is a sequence of TFRecords, each one serialized Event
// (src/monitor/tfevent.proto, TensorFlow's field numbers):
//
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
//   length bytes of data          | uint32 masked CRC-32C of the data
//
// The first record names the format ("brain.Event:2"); every later one holds
// the scalars of one step. The protobuf types stay inside event_writer.cpp:
// users of this header need neither protobuf's headers nor its library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace brisk::monitor {

// CRC-32C (Castagnoli polynomial, reflected: 0x82F63B78), as TFRecords use it.
uint32_t crc32c(const void* data, size_t n);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a
// CRC stored next to data that itself holds CRCs does not look like one.
uint32_t mask_crc32c(uint32_t crc);

class EventWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<host> (with ".1", ".2",
  // ... appended when a file of that name exists: a resumed run always adds
  // a file and never writes into an earlier one) and writes the
  // file_version record. Throws core::IoError naming the file.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Adds a scalar to the event the next write() sends. Stored as a float32
  // (TensorBoard's simple_value); NaN and infinities are kept as such.
  void scalar(std::string_view tag, double value);
  // Writes the pending scalars as one event at `step`, then flushes the file
  // to the OS (no fsync). Nothing pending: writes nothing. Once the first
  // steps have been written, a step with the same tags (or fewer) allocates
  // nothing: the message, its values and the record buffer are reused.
  void write(int64_t step);
  // A SessionLog START event at `step`: a resumed run's first record after
  // the file version. TensorBoard then drops the events of steps >= step
  // that earlier files hold (steps the previous run logged after its last
  // checkpoint, which the resumed run computes again).
  void session_start(int64_t step);

  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brisk::monitor
