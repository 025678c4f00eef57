-- minuet-ai.nvim (init.lua): completion through mellum-proxy's OpenAI FIM endpoint.
-- api_key names an environment variable: ${api_key_env}${api_key_note}.
-- The virtual-text frontend with auto_trigger_ft is what asks for completions as you type (without a
-- frontend that auto-triggers, minuet completes only on demand); its keymap is how a suggestion is accepted
-- (minuet maps no key by default). request_timeout (curl --max-time) is the proxy's deadline plus room for
-- its answer: a curl that gives up at the deadline never reads the answer the proxy sends then.
require('minuet').setup {
  provider = 'openai_fim_compatible',
  n_completions = 1,
  request_timeout = ${client_timeout_s},
  throttle = ${debounce_ms},
  debounce = ${debounce_ms},
  virtualtext = {
    auto_trigger_ft = { '*' },
    keymap = {
      accept = '<A-A>', -- the whole suggestion
      accept_line = '<A-a>', -- one line of it
      accept_n_lines = '<A-z>',
      prev = '<A-[>',
      next = '<A-]>',
      dismiss = '<A-e>',
    },
  },
  provider_options = {
    openai_fim_compatible = {
      api_key = '${api_key_env}',
      name = 'mellum-proxy',
      end_point = '${base_url}/v1/completions',
      model = 'mellum',
      stream = true,
      optional = { max_tokens = ${max_tokens}, top_p = 0.9 },
    },
  },
}
