-- cursortab.nvim (sweepai/cursortab.nvim): completions through mellum-proxy. Its "fim" provider writes the
-- prompt as fim_tokens.prefix .. before .. fim_tokens.suffix .. after .. fim_tokens.middle and posts it to
-- url .. completion_path, streamed (server/provider/fim/fim.go); Mellum's tokens are StarCoder's, and the proxy
-- renders the prompt again in the served model's own layout. A Sweep next-edit model instead: type = "sweep"
-- (its original/, current/ and updated/ file blocks pass through the proxy untouched, as an edit region).
-- The proxy holds each keystroke's request only while the server is busy, so the plugin's own debounce is the
-- smallest it takes; its timeout leaves room for the proxy's answer at its deadline (1500 ms).
-- An auth_token on the proxy: api_key_env names the variable that holds it (MELLUM_PROXY_AUTH_TOKEN); without
-- one it stays empty and no key is sent.
require("cursortab").setup({
  behavior = {
    text_change_debounce = 1,
  },
  provider = {
    type = "fim",
    url = "http://127.0.0.1:8011",
    completion_path = "/v1/completions",
    api_key_env = "",
    model = "mellum",
    max_tokens = 128,
    completion_timeout = 2000,
    fim_tokens = { prefix = "<fim_prefix>", suffix = "<fim_suffix>", middle = "<fim_middle>" },
  },
})
