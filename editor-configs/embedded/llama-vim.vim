" llama.vim (init.vim or .vimrc, before the plugin loads): FIM through mellum-proxy's /infill.
" `endpoint_fim` replaced `endpoint` (autoload/llama.vim); `api_key` is sent as a Bearer token, which the
" proxy checks only when it runs with an auth_token.
let g:llama_config = {
    \ 'endpoint_fim': 'http://127.0.0.1:8011/infill',
    \ 'api_key': '',
    \ 'n_predict': 48,
    \ 't_max_prompt_ms': 3000,
    \ 't_max_predict_ms': 3000,
    \ 'auto_fim': v:true,
    \ }
