-- minuet-ai.nvim (init.lua): completion through mellum-proxy's OpenAI FIM endpoint.
-- api_key names an environment variable; TERM is always set and the proxy needs no key.
require('minuet').setup {
  provider = 'openai_fim_compatible',
  n_completions = 1,
  request_timeout = ${timeout_s},
  throttle = ${debounce_ms},
  debounce = ${debounce_ms},
  provider_options = {
    openai_fim_compatible = {
      api_key = 'TERM',
      name = 'mellum-proxy',
      end_point = '${base_url}/v1/completions',
      model = 'mellum',
      stream = true,
      optional = { max_tokens = ${max_tokens}, top_p = 0.9 },
    },
  },
}
