//! The model's own chat template (the GGUF's `tokenizer.chat_template`, a Jinja template as
//! Hugging Face's `apply_chat_template` renders it), rendered with minijinja.

use minijinja::{Environment, ErrorKind};

use super::api::Message;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source`. `bos` and `eos` are the texts of the special tokens, which templates
    /// may print (`{{ bos_token }}`).
    pub fn new(source: &str, bos: String, eos: String) -> anyhow::Result<Self> {
        let mut env = Environment::new();
        // As transformers' ImmutableSandboxedEnvironment (and llama.cpp's) render them.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        // Templates call Python's string methods (`.strip()`, `.startswith()`, ...).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| anyhow::anyhow!("the chat template does not compile: {e:#}"))?;
        Ok(Self { env, bos, eos })
    }

    /// The prompt for `messages`, ending with the assistant's turn opened
    /// (`add_generation_prompt`). A template that refuses the messages (e.g. roles out of
    /// order: `raise_exception`) gives its message.
    pub fn render(&self, messages: &[Message]) -> Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos,
            eos_token => &self.eos,
        })
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => e.detail().unwrap_or("the chat template refused these messages").to_string(),
            _ => format!("the chat template failed on these messages: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
        {{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}\
        {% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}\
        {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn msg(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into() }
    }

    #[test]
    fn smollm2_template_gives_the_cli_prompt() {
        let t = ChatTemplate::new(SMOLLM2, String::new(), "<|im_end|>".into()).unwrap();
        let got = t.render(&[msg("user", "What is 2+2?")]).unwrap();
        let cli = crate::tokenizer::Tokenizer::chatml_prompt(SMOLLM2, None, "What is 2+2?").unwrap();
        assert_eq!(got, cli);
        let got = t.render(&[msg("system", "Be terse."), msg("user", "Hi")]).unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_bos_and_raise_exception() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}\
                   {% endif %}[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "<s>".into(), "</s>".into()).unwrap();
        assert_eq!(t.render(&[msg("user", "  hi ")]).unwrap(), "<s>[USER] hi\n");
        assert_eq!(t.render(&[msg("tool", "x")]).unwrap_err(), "no tools");
        assert!(ChatTemplate::new("{% for %}", String::new(), String::new()).is_err());
    }
}
