" llama.vim (init.vim or .vimrc, before the plugin loads): FIM through mellum-proxy's /infill.
" `endpoint_fim` replaced `endpoint` (autoload/llama.vim); `api_key` is sent as a Bearer token, which the
" proxy checks only when it runs with an auth_token.
let g:llama_config = {
    \ 'endpoint_fim': '${base_url}/infill',
    \ 'api_key': '${api_key}',
    \ 'n_predict': ${max_tokens},
    \ 't_max_prompt_ms': ${timeout_ms},
    \ 't_max_predict_ms': ${timeout_ms},
    \ 'auto_fim': v:true,
    \ }
