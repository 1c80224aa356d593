// `brisk encode` and `brisk decode`: sequences -> latents -> sequences with a
// sequence autoencoder checkpoint (autoencoder_cmds.cpp). main.cpp only adds
// them and runs whichever was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct AutoencoderCommands {
  CLI::App* encode = nullptr;
  CLI::App* decode = nullptr;
  std::function<int()> run;  // runs whichever of the two was parsed
  bool parsed() const { return (encode && *encode) || (decode && *decode); }
};

AutoencoderCommands add_autoencoder_commands(CLI::App& parent);

}  // namespace brisk::cli
