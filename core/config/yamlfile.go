package config

import (
	"errors"
	"fmt"

	yamlv4 "go.yaml.in/yaml/v4"
)

// yamlParser is the koanf parser of config files. It reads YAML with
// go.yaml.in/yaml/v4, whose errors carry the line where parsing failed
// (v3's name the line before the construct that failed, counted from 0),
// and reports that line, then where the construct began.
type yamlParser struct{}

func (yamlParser) Unmarshal(b []byte) (map[string]any, error) {
	var m map[string]any
	if err := yamlv4.Unmarshal(b, &m); err != nil {
		return nil, yamlError(err)
	}
	return m, nil
}

func (yamlParser) Marshal(m map[string]any) ([]byte, error) { return yamlv4.Marshal(m) }

// yamlError rewrites a v4 load error as "yaml: line N: problem (while
// parsing a flow sequence that starts at line M)".
func yamlError(err error) error {
	var le *yamlv4.LoadError
	if !errors.As(err, &le) || le.Mark.Line == 0 {
		return err
	}
	msg := fmt.Sprintf("yaml: line %d: %s", le.Mark.Line, le.Message)
	if le.ContextMsg != "" && le.ContextMark.Line > 0 && le.ContextMark.Line != le.Mark.Line {
		msg += fmt.Sprintf(" (%s that starts at line %d)", le.ContextMsg, le.ContextMark.Line)
	}
	return errors.New(msg)
}
