-- minuet-ai.nvim (init.lua): completion through mellum-proxy's OpenAI FIM endpoint.
-- api_key names an environment variable; TERM is always set and the proxy needs no key.
require('minuet').setup {
  provider = 'openai_fim_compatible',
  n_completions = 1,
  request_timeout = 1.5,
  throttle = 1,
  debounce = 1,
  provider_options = {
    openai_fim_compatible = {
      api_key = 'TERM',
      name = 'mellum-proxy',
      end_point = 'http://127.0.0.1:8011/v1/completions',
      model = 'mellum',
      stream = true,
      optional = { max_tokens = 128, top_p = 0.9 },
    },
  },
}
